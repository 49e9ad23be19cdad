"""bf16wo (engine/quant/bf16_weights.py): bf16 weights, fp32 everything else. Our panel kernel widens each bf16
weight exactly and sums in the fp32 kernel's order, so the variant gives, bit for bit, what the fp32 model gives
with the same rounded weights: through the C++ layer loop and the Python one, alone and batched. Where it cannot
mean what it says (a bf16 load, off the CPU) it is refused with what to do."""

import copy
import dataclasses

import pytest
import torch
from test_cpu_layers import CAN_BUILD, _alone_run, _batched_run, _layers, _runner

from engine.bench import run_request
from engine.core.config import GenerationConfig
from engine.core.errors import LoadError
from engine.kernels.catalogue import Kernel
from engine.model.loaded import weight_bytes
from engine.quant.bf16_weights import Bf16WeightLinear
from engine.quant.quantize import quantizable_linears
from engine.runtime.plan import OURS_ROWS
from engine.serving.variants import build, precheck
from engine.serving.work import step_weight_bytes
from support import ask

needs_kernels = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (asserted in test_cpu_layers)")


def _rounded(model):
    """A copy of `model` whose block linears' fp32 weights are rounded to bf16 values (still fp32, plain Linears)."""
    ref = copy.deepcopy(model)
    for _, _, lin in quantizable_linears(ref):
        lin.weight.data = lin.weight.data.bfloat16().float()
    return ref


@needs_kernels
def test_bf16wo_gives_the_fp32_bits_of_its_rounded_weights_in_either_loop(bundled, monkeypatch):
    _same_bits_as_rounded_fp32(bundled, monkeypatch)


@needs_kernels
def test_bf16wo_gives_the_fp32_bits_of_its_rounded_weights_on_a_tiny_model(tiny, monkeypatch):
    """The same on the tiny model: quick enough for scripts/qemu_cpu_classes.sh (the AVX2 kernel under Haswell)."""
    _same_bits_as_rounded_fp32(tiny, monkeypatch)


def _same_bits_as_rounded_fp32(loaded, monkeypatch):
    variant = build(loaded, "bf16wo")[0].model
    assert all(type(m) is Bf16WeightLinear and m.weight.dtype == torch.bfloat16
               for blk in variant.blocks for m in (blk.qkv, blk.o, blk.gate_up, blk.down))
    reference = _rounded(loaded.model)
    _layers(monkeypatch, True)
    ours, fp32 = _runner(variant), _runner(reference)
    assert ours.plan.layer_loop == fp32.plan.layer_loop == "cpp"
    assert ours.plan.linears["qkv"].kernel(1) is Kernel.OURS_BF16W and fp32.plan.linears["qkv"].kernel(1) is Kernel.OURS_FP32
    runs = {"cpp": (_batched_run(ours), _alone_run(ours), _batched_run(fp32), _alone_run(fp32))}
    _layers(monkeypatch, False)
    ours_py = _runner(variant)
    assert ours_py.plan.layer_loop == "python"
    runs["python"] = (_batched_run(ours_py), _alone_run(ours_py))
    (logits, kv), alone, (ref_logits, ref_kv), ref_alone = runs["cpp"]
    (py_logits, py_kv), py_alone = runs["python"]
    for got in ((logits, kv, alone), (py_logits, py_kv, py_alone)):
        assert all(torch.equal(a, b) for a, b in zip(got[0] + got[1] + got[2], ref_logits + ref_kv + ref_alone))
    # and they are not the unrounded fp32 model's: the rounding is the variant's one error
    assert not torch.equal(alone[0], _alone_run(_runner(loaded.model))[0])


@needs_kernels
def test_bf16wo_greedy_is_the_fp32_greedy_of_its_rounded_weights_and_a_long_prompt_takes_mkl(bundled):
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=16)
    loaded, runner = build(bundled, "bf16wo+head")
    reference = _rounded(bundled.model)
    reference.lm_head = torch.nn.Linear(reference.lm_head.in_features, reference.lm_head.out_features, bias=False)
    reference.lm_head.weight.data = bundled.model.lm_head.weight.data.bfloat16().float()  # its own copy, untied
    ref_loaded = dataclasses.replace(bundled, model=reference)
    prompt = ask("Name three colors.")
    got = run_request(loaded, prompt, greedy, runner=runner)
    want = run_request(ref_loaded, prompt, greedy, runner=_runner(reference))
    assert got.token_ids == want.token_ids and len(got.token_ids) > 4
    plan = runner.plan  # past our kernel's rows: the layer's own forward, the weights widened into MKL's GEMM
    assert plan.linears["lm_head"].kernel(1) is Kernel.OURS_BF16W
    assert all(plan.linears[r].kernel(OURS_ROWS + 1) is Kernel.ATEN for r in plan.linears)
    ids = torch.arange(100, 100 + OURS_ROWS + 44)
    whole = runner.forward(ids, runner.new_cache(400), all_logits=True)
    cache = runner.new_cache(400)
    parts = torch.cat([runner.forward(ids[:200], cache, all_logits=True), runner.forward(ids[200:], cache, all_logits=True)])
    assert float((whole - parts).abs().max() / parts.abs().max()) < 1e-4  # fp32 sums in another order, no more


def test_bf16wo_halves_the_bytes_a_decode_step_reads(bundled):
    fp32, head = bundled.model, build(bundled, "bf16wo+head")[0].model
    blocks = sum(lin.weight.numel() for _, _, lin in quantizable_linears(fp32))
    embedding = fp32.embed.weight
    assert fp32.lm_head.weight is embedding  # tied: a step reads it whole as the head
    hidden = embedding.shape[1]
    want = step_weight_bytes(fp32) - 4 * blocks + 2 * blocks - 4 * embedding.numel() + 2 * embedding.numel() + 4 * hidden
    assert step_weight_bytes(head) == want  # bf16 blocks and head; of the fp32 embedding one row a step
    assert weight_bytes(head) == weight_bytes(fp32) - 2 * blocks + 2 * embedding.numel()  # the head's copy held too
    assert head.embed.weight is embedding and head.lm_head.weight.dtype == torch.bfloat16


def test_bf16wo_is_refused_where_it_cannot_mean_what_it_says(bundled):
    bf16 = build(bundled, "bf16")[0]
    for name in ("bf16wo", "bf16wo+head"):
        why = precheck(bf16, name)
        assert why and "--dtype fp32" in why and "bf16" in why
        with pytest.raises(LoadError, match="--dtype fp32"):
            build(bf16, name)
        elsewhere = precheck(dataclasses.replace(bundled, device=torch.device("meta")), name)
        assert elsewhere and "runs on CPU" in elsewhere
    assert precheck(bundled, "bf16wo") is None


def test_without_our_panel_kernel_bf16wo_runs_its_reference_and_says_so(tiny, monkeypatch):
    """Our kernels switched off (as where the extension cannot build): the page's variant info says why before
    the build and after it, and the variant still computes the fp32 product of its rounded weights (its own
    forward: the weights widened, then the fp32 matmul)."""
    from engine.serving.variants import VariantSet

    monkeypatch.setenv("LATENCY_LAB_GEMM", "off")
    variants = VariantSet(tiny, budget_bytes=10**10, defer_quality=True)
    why = {v.name: v for v in variants.infos()}["bf16wo"].kernel_fallback
    assert why and "LATENCY_LAB_GEMM=off" in why and "widen" in why
    runner = variants.get("bf16wo").runner
    assert runner.plan.linears["qkv"].kernel(1) is Kernel.ATEN and runner.plan.layer_loop == "python"
    assert {v.name: v for v in variants.infos()}["bf16wo"].kernel_fallback == "its plan chose ATen"
    reference = _rounded(tiny.model)
    ids = torch.arange(3, 20)
    got = runner.forward(ids, runner.new_cache(32), all_logits=True)
    ref = _runner(reference)
    want = ref.forward(ids, ref.new_cache(32), all_logits=True)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
