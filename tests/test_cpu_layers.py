"""The layer loop in one C++ call (engine/kernels/cpu_layers.py): the same bits as the Python loop it
replaces, batched (decode rows, prompt rows from position 0 and after a prefix, together) and
alone (one sequence through the runner), with projection biases (a Qwen2), and the Python loop
wherever a projection is not our fp32 kernel's. Which loop runs is the plan's decision
(engine/runtime/plan.py), made with the switches as they are when it is made."""

import copy
import dataclasses
import threading

import pytest
import torch
from conftest import build_tiny_model_dir

from engine.core.config import LoadConfig
from engine.kernels import cpu_gemm, cpu_layers, cpu_qdot, switches
from engine.model.loader import load
from engine.platform import capabilities
from engine.runtime.plan import make_plan
from engine.runtime.runner import Batch, Runner

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
needs_kernels = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (asserted below)")


def _layers(monkeypatch, on: bool) -> None:
    monkeypatch.setenv("LATENCY_LAB_LAYERS", "on" if on else "off")


def _runner(model, **inject) -> Runner:
    """A runner with our fp32 kernel chosen for the rows (the C++ loop's condition), whatever this
    machine's measurement picked, and the layer loop the switches allow now."""
    return Runner(model, make_plan(model, **{"one_row": "ours", **inject}))


def _kv(c) -> list:
    """A cache's valid keys and values, and its int8 scales where it keeps them."""
    return [getattr(c, name)[:, :, :, : c.length].clone() for name in c._buffers()]


def _batched_run(runner, kinds=("model",) * 4):
    """Three forwards over four sequences (their caches at precisions `kinds`): prompts at position 0,
    decode rows beside a prompt that continues a prefix (a masked SDPA), then decode rows only. Logits
    and each cache's KV."""
    caches = [runner.new_cache(64, kv) for kv in kinds]
    logits = [runner.run(Batch([list(range(5, 25)), list(range(7, 12))], caches[:2]))]
    logits.append(runner.run(Batch([[3], list(range(30, 40)), [9], list(range(2, 9))], caches)))
    logits.append(runner.run(Batch([[3], [4], [5], [6]], caches)))
    return logits, [t for c in caches for t in _kv(c)]


def _alone_run(runner, kv="model"):
    """A prompt, then 6 greedy decode steps, one sequence."""
    cache, out = runner.new_cache(64, kv), []
    logits = runner.forward(torch.arange(40, 60), cache, all_logits=True)
    out.append(logits)
    for _ in range(6):
        logits = runner.forward(logits[-1:].argmax(-1), cache)
        out.append(logits)
    return out


@needs_kernels
def test_the_cpp_loop_serves_here_and_gives_the_python_loops_bits(bundled, monkeypatch):
    model = bundled.model
    _layers(monkeypatch, True)
    cpp_runner = _runner(model)
    assert cpu_layers.unavailable_reason() is None and cpp_runner.plan.layer_loop == "cpp"
    calls, me = [], threading.get_ident()  # this thread's calls: a session engine's worker may idle-measure on the same model
    run_layers = cpu_layers.run_layers
    monkeypatch.setattr(cpu_layers, "run_layers",
                        lambda *a: (threading.get_ident() == me and calls.append(1)) or run_layers(*a))
    cpp = _batched_run(cpp_runner), _alone_run(cpp_runner)
    assert len(calls) == 3 + 7  # every forward of both runs went through the C++ loop
    _layers(monkeypatch, False)
    py_runner = _runner(model)
    assert py_runner.plan.layer_loop == "python" and "LATENCY_LAB_LAYERS" in py_runner.plan.layer_loop_text
    python = _batched_run(py_runner), _alone_run(py_runner)
    assert len(calls) == 10  # none through it
    (cpp_logits, cpp_kv), cpp_alone = cpp
    (py_logits, py_kv), py_alone = python
    assert all(torch.equal(a, b) for a, b in zip(cpp_logits, py_logits))
    assert all(torch.equal(a, b) for a, b in zip(cpp_kv, py_kv))
    assert all(torch.equal(a, b) for a, b in zip(cpp_alone, py_alone))


@needs_kernels
def test_projection_biases_are_added_as_the_python_loop_adds_them(tmp_path, tokenizer, monkeypatch):
    path = build_tiny_model_dir(tmp_path / "qwen", tokenizer, model_type="qwen2", seed=3, use_sliding_window=False)
    model = load(LoadConfig(model=str(path), dtype="fp32", progress=False)).model
    assert model.blocks[0].qkv.bias is not None  # Qwen2 projects q, k and v with a bias
    torch.nn.init.normal_(model.blocks[0].qkv.bias)  # a random model starts them at zero
    _layers(monkeypatch, True)
    cpp_runner = _runner(model)
    assert cpp_runner.plan.layer_loop == "cpp"
    cpp = _batched_run(cpp_runner)
    _layers(monkeypatch, False)
    python = _batched_run(_runner(model))
    assert all(torch.equal(a, b) for a, b in zip(cpp[0] + cpp[1], python[0] + python[1]))


def test_a_projection_our_kernel_does_not_serve_keeps_the_python_loop(tiny):
    """A quantized or bf16 projection: the plan must not give the model the C++ loop (it would call our
    fp32 kernel on weights it does not hold)."""
    model = tiny.model
    if CAN_BUILD:
        assert make_plan(model, one_row="ours").layer_loop == "cpp"
    originals = [blk.down for blk in model.blocks]
    try:  # not monkeypatch: its undo deletes a submodule it did not find in the instance's __dict__
        for blk, down in zip(model.blocks, originals):
            blk.down = torch.nn.Linear(down.in_features, down.out_features, bias=False, dtype=torch.bfloat16)
        plan = make_plan(model, one_row="ours")
        assert plan.layer_loop == "python" and plan.cpp_rows == 0
        assert "not a plain fp32 Linear" in plan.layer_loop_text
        model.blocks[0].down = originals[0]  # one layer's kind differs: the plan names one kernel a role, so says no
        with pytest.raises(ValueError, match="not all of one kind"):
            make_plan(model, one_row="ours")
    finally:
        for blk, down in zip(model.blocks, originals):
            blk.down = down
    assert [blk.down for blk in model.blocks] == originals


def test_engine_info_says_where_the_layer_loop_runs(bundled, monkeypatch):
    _layers(monkeypatch, True)
    on = make_plan(bundled.model, one_row="ours").layer_loop_text
    _layers(monkeypatch, False)
    off = make_plan(bundled.model, one_row="ours").layer_loop_text
    assert off == f"{cpu_layers.PYTHON} (turned off (LATENCY_LAB_LAYERS=off))"
    assert on == (cpu_layers.NAME if CAN_BUILD else f"{cpu_layers.PYTHON} ({cpu_gemm.unavailable_reason()})")
    _layers(monkeypatch, True)  # one row through MKL: the C++ loop cannot take a decode step
    assert make_plan(bundled.model, one_row="gemv").layer_loop_text.startswith(
        f"{cpu_layers.PYTHON} (the kernel decision sends")


def test_a_bench_can_measure_the_python_loop_side_by_side(bundled):
    """`bench bandwidth --python-loop`: a plan made inside forced_off("layers") runs the Python loop; one
    made after, the C++ one."""
    with switches.forced_off("layers"):
        plan = make_plan(bundled.model, one_row="ours")
        assert plan.layer_loop == "python" and plan.layer_loop_text.startswith(cpu_layers.PYTHON)
    assert (make_plan(bundled.model, one_row="ours").layer_loop == "cpp") == CAN_BUILD


@needs_kernels
@pytest.mark.parametrize("variant", ["int4w8a", "int8w8a", "int4w8a+head8"])
def test_a_w8a_variants_layers_run_in_the_cpp_loop_with_the_python_loops_bits(bundled, variant, monkeypatch):
    """The w8a layers (engine/quant/w8a.py, one kind and form for every projection) take the C++ loop
    too: the same integer-kernel calls on the same rows, so the same bits as the Python loop."""
    from engine.serving.variants import build

    model = build(bundled, variant)[0].model
    _layers(monkeypatch, True)
    cpp_runner = _runner(model)
    assert cpp_runner.plan.layer_loop == "cpp" and cpp_runner.plan.layer_loop_text == cpu_layers.NAME
    cpp = _batched_run(cpp_runner), _alone_run(cpp_runner)
    _layers(monkeypatch, False)
    py_runner = _runner(model)
    python = _batched_run(py_runner), _alone_run(py_runner)
    (cpp_logits, cpp_kv), cpp_alone = cpp
    (py_logits, py_kv), py_alone = python
    assert all(torch.equal(a, b) for a, b in zip(cpp_logits + cpp_kv + cpp_alone, py_logits + py_kv + py_alone))
    _layers(monkeypatch, True)
    o, form = model.blocks[3].o, cpu_qdot.best_form(capabilities.detect())
    model.blocks[3].o = torch.nn.Linear(o.in_features, o.out_features, bias=False)  # a plain fp32 one among
    assert cpu_layers.loop_kind(model, form) is None  # them: no one kind (the plan refuses such a model)
    model.blocks[3].o = o
    assert cpu_layers.loop_kind(model, form) is not None
    assert cpu_layers.loop_kind(model, None) is None  # the torch reference (no form): the Python loop
    no_avx = dataclasses.replace(capabilities.detect(), isa=())
    assert _runner(model, caps=no_avx).plan.layer_loop == "python"
    widened = build(build(bundled, "bf16")[0], variant)[0].model  # built from bf16: fp32 (w8a.widen)
    assert widened.dtype == torch.float32 and _runner(widened).plan.layer_loop == "cpp"
    bf16 = copy.copy(widened)  # bf16 activations (its embedding's dtype): the loop runs fp32 only
    bf16.embed = torch.nn.Embedding.from_pretrained(widened.embed.weight.bfloat16())
    assert "fp32 activations" in Runner(bf16, make_plan(bf16, one_row="ours")).plan.layer_loop_text


@needs_kernels
@pytest.mark.parametrize("variant", ["fp32", "int8w8a", "int4w8a"])
def test_caches_at_every_precision_run_in_the_cpp_loop_with_the_python_loops_bits(bundled, variant, monkeypatch):
    """The kv_cache_dtype toggle (fp16, bf16, int8 with its scales): the plan gives such a cache the C++ loop
    too (Plan.loop_kv), whose decode rows take decode_attention_kv and whose prompt rows are stored and read as
    KVCache does: the Python loop's bits, logits, keys, values and scales, alone, batched and with precisions
    mixed in one forward."""
    from engine.serving.variants import build

    model = bundled.model if variant == "fp32" else build(bundled, variant)[0].model
    runs = [(kv,) * 4 for kv in ("fp16", "bf16", "int8")] + [("int8", "model", "fp16", "int8")]
    _layers(monkeypatch, True)
    cpp_runner = _runner(model)
    assert cpp_runner.plan.layer_loop == "cpp" and set(cpp_runner.plan.loop_kv) == {"model", "fp16", "bf16", "int8"}
    assert cpp_runner.plan.loop_rows(["int8", "fp16"]) == cpp_runner.plan.cpp_rows > 0
    assert cpp_runner.plan.kv_attention_text.endswith("the layers in one C++ call")
    calls, me = [], threading.get_ident()
    run_layers = cpu_layers.run_layers
    monkeypatch.setattr(cpu_layers, "run_layers",
                        lambda *a: (threading.get_ident() == me and calls.append(1)) or run_layers(*a))
    cpp = [_batched_run(cpp_runner, kinds) for kinds in runs] + [_alone_run(cpp_runner, kv) for kv in runs[2][:1]]
    assert len(calls) == 3 * len(runs) + 7  # every forward through the C++ loop
    _layers(monkeypatch, False)
    py_runner = _runner(model)
    assert py_runner.plan.loop_rows(["int8"]) == 0 and "the layers in Python" in py_runner.plan.kv_attention_text
    python = [_batched_run(py_runner, kinds) for kinds in runs] + [_alone_run(py_runner, kv) for kv in runs[2][:1]]
    assert len(calls) == 3 * len(runs) + 7  # none through it
    for (cpp_logits, cpp_kv), (py_logits, py_kv) in zip(cpp[:-1], python[:-1]):
        assert all(torch.equal(a, b) for a, b in zip(cpp_logits + cpp_kv, py_logits + py_kv))
        assert len(cpp_kv) == len(py_kv) > 0
    assert all(torch.equal(a, b) for a, b in zip(cpp[-1], python[-1]))  # one int8 sequence alone
    int8_kv = cpp[2][1]
    assert int8_kv[0].dtype == torch.int8 and int8_kv[2].dtype == torch.float32  # values and scales compared


@needs_kernels
def test_a_w8a_decode_step_gives_the_same_bits_with_its_held_team_or_one_thread(bundled, monkeypatch):
    """With more than one thread a w8a decode step holds one OpenMP team for its layers (cpu_tiles.h Team),
    its tiles and attention tasks shared among the team; with one thread there is no team. Which thread
    computes a tile never changes its bits."""
    from engine.serving.variants import build

    model = build(bundled, "int4w8a+head8")[0].model
    _layers(monkeypatch, True)
    runner = _runner(model)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        team = _alone_run(runner) + _alone_run(runner, "int8")
        torch.set_num_threads(1)
        alone = _alone_run(runner) + _alone_run(runner, "int8")
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(team, alone))


@needs_kernels
def test_a_decode_step_through_the_cpp_loop_is_one_call_from_token_ids_to_logits(bundled, monkeypatch):
    """Where the plan folds the final norm into a w8a head (`head_norm`), the C++ call embeds the token ids
    and runs the head too: no Python op between, neither nn.Embedding's forward nor the head's
    normed_product (the same bits: the test above). A forward that wants every row's logits (verification)
    gets the rows back and its head runs as before."""
    from engine.serving.variants import build

    model = build(bundled, "int4w8a+head8")[0].model
    _layers(monkeypatch, True)
    runner = _runner(model)
    assert runner.plan.head_norm and runner.plan.layer_loop == "cpp"
    calls = []
    head, embed = type(model.lm_head), type(model.embed)
    normed, forward = head.normed_product, embed.forward
    monkeypatch.setattr(head, "normed_product", lambda *a: calls.append("head") or normed(*a))
    monkeypatch.setattr(embed, "forward", lambda *a: calls.append("embed") or forward(*a))
    cache = runner.new_cache(16)
    logits = runner.forward(torch.tensor([1, 504, 3458]), cache)
    assert logits.shape == (1, model.vocab_size) and cache.length == 3 and calls == []
    step = runner.forward(logits.argmax(-1), cache)
    assert step.shape == (1, model.vocab_size) and cache.length == 4 and calls == []
    rows = runner.forward(torch.tensor([5, 6]), cache, all_logits=True)
    assert rows.shape == (2, model.vocab_size) and calls == []  # every row's logits: the head after the call
    folded = runner.forward(torch.tensor([7]), cache)
    cache.crop(6)
    runner._layers = (runner._layers[0], False, False)  # neither end in the call: the Python embedding, the loop,
    # the Python head
    assert torch.equal(runner.forward(torch.tensor([7]), cache), folded) and calls == ["embed", "head"]


@needs_kernels
def test_a_token_id_outside_the_vocabulary_is_a_clear_error_and_the_runner_goes_on(bundled, monkeypatch):
    """The C++ call copies the embedding's rows itself: an id past the table says so (no read past its end), and
    the same runner and cache serve the next step."""
    from engine.serving.variants import build

    model = build(bundled, "int4w8a+head8")[0].model
    _layers(monkeypatch, True)
    runner = _runner(model)
    cache = runner.new_cache(16)
    runner.forward(torch.tensor([1, 504, 3458]), cache)
    for bad in (model.vocab_size, -1):
        with pytest.raises(RuntimeError, match=rf"token id {bad} is outside the vocabulary \[0, {model.vocab_size}\)"):
            runner.forward(torch.tensor([bad]), cache)
    assert cache.length == 3
    assert runner.forward(torch.tensor([7]), cache).shape == (1, model.vocab_size) and cache.length == 4
