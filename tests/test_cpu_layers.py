"""The layer loop in one C++ call (engine/kernels/cpu_layers.py): the same bits as the Python loop it
replaces, batched (decode rows, prompt rows from position 0 and after a prefix, together) and
alone (FastLlama.forward), with projection biases (a Qwen2), and the Python loop wherever a
projection is not our fp32 kernel's."""

import threading

import pytest
import torch
from conftest import build_tiny_model_dir

from engine.core.config import LoadConfig
from engine.kernels import choose, cpu_gemm, cpu_layers, switches
from engine.kernels import plan as kernel_plan
from engine.platform import capabilities
from engine.model.forward import forward as forward_batch
from engine.model.loader import load

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
needs_kernels = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (asserted below)")


def _layers(monkeypatch, on: bool) -> None:
    monkeypatch.setenv("LATENCY_LAB_LAYERS", "on" if on else "off")


@pytest.fixture
def ours_plan(bundled):
    """The bundled model with our fp32 kernel chosen for its rows (the C++ loop's condition), whatever
    this machine's measurement picked; the measured plan restored after."""
    saved = bundled.model.kernel_plan
    kernel_plan.inject(bundled.model, "ours")
    yield bundled
    bundled.model.kernel_plan = saved
    choose.prepare(bundled.model)


def _batched_run(model):
    """Three forwards over four sequences: prompts at position 0, decode rows beside a prompt that
    continues a prefix (a masked SDPA), then decode rows only. Logits and each cache's KV."""
    caches = [model.new_cache(64) for _ in range(4)]
    logits = [forward_batch(model, [list(range(5, 25)), list(range(7, 12))], caches[:2])]
    logits.append(forward_batch(model, [[3], list(range(30, 40)), [9], list(range(2, 9))], caches))
    logits.append(forward_batch(model, [[3], [4], [5], [6]], caches))
    kv = [torch.cat([c.k[..., : c.length, :], c.v[..., : c.length, :]]).clone() for c in caches]
    return logits, kv


def _alone_run(model):
    """A prompt, then 6 greedy decode steps, one sequence through FastLlama.forward."""
    cache, out = model.new_cache(64), []
    logits = model.forward(torch.arange(40, 60), cache, all_logits=True)
    out.append(logits)
    for _ in range(6):
        logits = model.forward(logits[-1:].argmax(-1), cache)
        out.append(logits)
    return out


@needs_kernels
def test_the_cpp_loop_serves_here_and_gives_the_python_loops_bits(ours_plan, monkeypatch):
    model = ours_plan.model
    assert cpu_layers.unavailable_reason() is None and cpu_layers.serves(model)
    calls, me = [], threading.get_ident()  # this thread's calls: a session engine's worker may idle-measure on the same model
    run_layers = cpu_layers.run_layers
    monkeypatch.setattr(cpu_layers, "run_layers",
                        lambda *a: (threading.get_ident() == me and calls.append(1)) or run_layers(*a))
    _layers(monkeypatch, True)
    cpp = _batched_run(model), _alone_run(model)
    assert len(calls) == 3 + 7  # every forward of both runs went through the C++ loop
    _layers(monkeypatch, False)
    assert not cpu_layers.serves(model) and "LATENCY_LAB_LAYERS" in cpu_layers.unavailable_reason()
    python = _batched_run(model), _alone_run(model)
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
    kernel_plan.inject(model, "ours")  # every row on our kernel: the C++ loop's condition
    assert model.blocks[0].qkv.bias is not None  # Qwen2 projects q, k and v with a bias
    torch.nn.init.normal_(model.blocks[0].qkv.bias)  # a random model starts them at zero
    assert cpu_layers.serves(model)
    _layers(monkeypatch, True)
    cpp = _batched_run(model)
    _layers(monkeypatch, False)
    python = _batched_run(model)
    assert all(torch.equal(a, b) for a, b in zip(cpp[0] + cpp[1], python[0] + python[1]))


def test_a_projection_our_kernel_does_not_serve_keeps_the_python_loop(tiny):
    """A quantized or bf16 projection: the C++ loop must not take the model (it would call our fp32
    kernel on weights it does not hold)."""
    model = tiny.model
    if CAN_BUILD:
        assert cpu_layers.serves(model)
    blk = model.blocks[-1]
    original = blk.down
    try:  # not monkeypatch: its undo deletes a submodule it did not find in the instance's __dict__
        blk.down = torch.nn.Linear(original.in_features, original.out_features, bias=False, dtype=torch.bfloat16)
        assert not cpu_layers.serves(model)
    finally:
        blk.down = original
    assert blk.down is original


def test_engine_info_says_where_the_layer_loop_runs(bundled_engine, ours_plan, monkeypatch):
    _layers(monkeypatch, True)
    on = bundled_engine.info().layer_loop
    _layers(monkeypatch, False)
    off = bundled_engine.info().layer_loop
    assert off == f"{cpu_layers.PYTHON} (turned off (LATENCY_LAB_LAYERS=off))"
    assert on == (cpu_layers.NAME if CAN_BUILD else f"{cpu_layers.PYTHON} ({cpu_gemm.unavailable_reason()})")
    kernel_plan.inject(ours_plan.model, "gemv")  # one row through MKL: the C++ loop cannot take a decode step
    _layers(monkeypatch, True)
    assert bundled_engine.info().layer_loop.startswith(f"{cpu_layers.PYTHON} (the kernel decision sends")


def test_a_bench_can_measure_the_python_loop_side_by_side(ours_plan):
    bundled = ours_plan
    """`bench bandwidth --python-loop`: the Python loop inside forced_off("layers"), the C++ one after."""
    with switches.forced_off("layers"):
        assert not cpu_layers.serves(bundled.model)
        assert cpu_layers.describe(bundled.model).startswith(cpu_layers.PYTHON)
    assert cpu_layers.serves(bundled.model) == CAN_BUILD


@needs_kernels
@pytest.mark.parametrize("variant", ["int4w8a", "int8w8a"])
def test_a_w8a_variants_layers_run_in_the_cpp_loop_with_the_python_loops_bits(bundled, variant, monkeypatch):
    """The w8a layers (engine/quant/w8a.py, one kind and form for every projection) take the C++ loop
    too: the same integer-kernel calls on the same rows, so the same bits as the Python loop."""
    from engine.quant.quantize import build_variant

    model = build_variant(bundled, variant).model
    _layers(monkeypatch, True)
    assert cpu_layers.serves(model) and cpu_layers.describe(model) == cpu_layers.NAME
    cpp = _batched_run(model), _alone_run(model)
    _layers(monkeypatch, False)
    python = _batched_run(model), _alone_run(model)
    (cpp_logits, cpp_kv), cpp_alone = cpp
    (py_logits, py_kv), py_alone = python
    assert all(torch.equal(a, b) for a, b in zip(cpp_logits + cpp_kv + cpp_alone, py_logits + py_kv + py_alone))
    _layers(monkeypatch, True)
    model.blocks[3].o.isa = None  # one layer served by the torch reference: the loop must not take it
    assert not cpu_layers.serves(model)
