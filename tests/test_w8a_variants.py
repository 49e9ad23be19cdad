"""The w8a variants built on our integer kernels (engine/quant/w8a.py): the torch reference is the dequantized
product up to the activations' rounding, a variant is refused off the CPU, its greedy output is the same alone
and batched, a long prompt takes fp32 activations over the dequantized weights, a bf16 model's variant
computes in fp32 through the C++ loop, the final norm folds into the head's product with the same bits, and
a w8a product between oneDNN bf16 matmuls leaves theirs the same. The kernels themselves, form by form:
tests/test_cpu_qdot.py."""

from dataclasses import replace

import pytest
import torch
from test_cpu_qdot import _weights, needs_kernels
from torch import nn

from engine.core.errors import LoadError
from engine.kernels import catalogue, cpu_gemm, cpu_qdot
from engine.kernels.catalogue import Kernel
from engine.platform import capabilities
from engine.quant.w8a import Int4W8ALinear, Int8W8ALinear
from engine.quant.weight_only import Int4WeightOnlyLinear
from engine.runtime import plan
from engine.runtime.runner import Batch, Runner
from engine.serving.variants import build, precheck


def test_the_reference_is_the_dequantized_product_up_to_activation_rounding():
    torch.manual_seed(0)
    linear = nn.Linear(128, 48, bias=False)
    x = torch.randn(4, 128)
    for cls in (Int8W8ALinear, Int4W8ALinear):
        layer = cls.from_linear(linear)
        want = x @ layer.dequantized().T
        ref = {Int8W8ALinear: lambda: cpu_qdot.int8_reference(x, layer.weight_int8, layer.scale),
               Int4W8ALinear: lambda: cpu_qdot.int4_reference(x, layer.weight_q4)}[cls]()
        err = float((ref - want).abs().max() / want.abs().max())
        assert 0 < err < 0.02  # int8 activations: not the fp32 product's bits, but close to it


def test_a_w8a_variant_is_refused_off_the_cpu_with_advice(tiny):
    meta = replace(tiny, device=torch.device("meta"))
    reason = precheck(meta, "int4w8a")
    assert reason and "CPU only" in reason and "int4wo" in reason
    with pytest.raises(LoadError):
        build(meta, "int8w8a")


@needs_kernels
def test_a_w8a_variant_decodes_the_same_greedy_tokens_alone_and_batched(bundled):
    """int4w8a+head8: every projection through the integer kernels (the plan says so), its weights counted
    once, and a sequence's greedy tokens the same decoded alone and beside others."""
    from engine.model.loaded import weight_bytes
    from engine.quant.weight_only import Int8WeightOnlyLinear

    v, runner = build(bundled, "int4w8a+head8")
    model, p = v.model, runner.plan
    assert p.used(1) == "wo-int8act" and p.used(plan.OURS_ROWS) == "wo-int8act"
    if p.w8a_form in plan.EVERY_ROW_FORMS:  # a long prompt too, in the C++ loop
        assert p.used(5000) == "wo-int8act" and p.cpp_rows == plan.ALL
    else:  # the AVX2 form: past OURS_ROWS rows the fp32 GEMM over the dequantized weights
        assert p.used(plan.OURS_ROWS + 1) == "wo-dequant-fp32"
    assert p.layer_loop == "cpp" and p.w8a_form == cpu_qdot.best_form(capabilities.detect())
    assert p.decision("w8a kernel form").choice == p.w8a_form
    layers = [m for m in model.modules() if isinstance(m, Int4W8ALinear)]
    assert len(layers) == 30 * 4 and isinstance(model.lm_head, Int8W8ALinear)
    int4wo = build(bundled, "int4wo+head8")[0]
    # counted once, as int4wo+head8's: half a byte a weight, a 2-byte scale and offset per 32 (its one
    # layout); the head a byte a weight and an fp32 scale per channel; gathered into one huge-page region
    # (engine/platform/hugepages.py). int4wo and int8wo keep their scales in the activations' dtype they
    # measured (bf16, or fp32 where bf16 lost: seen under qemu -cpu Haswell), so they are counted here at
    # 2 (int4) and 4 (int8 head) bytes each
    sz = [m.scales_and_zeros for m in int4wo.model.modules() if isinstance(m, Int4WeightOnlyLinear)]
    head = int4wo.model.lm_head
    assert isinstance(head, Int8WeightOnlyLinear)
    assert weight_bytes(model) == (weight_bytes(int4wo.model) - sum(t.nbytes - 2 * t.numel() for t in sz)
                                   - head.scale.nbytes + 4 * head.scale.numel())
    assert len({m._buffers[n].untyped_storage().data_ptr() for m in (*layers, model.lm_head) for n in m.WEIGHTS}) == 1
    prompts = [[1, 504, 3458, 30], [1, 2683, 314], [1, 11, 17, 19, 23, 29]]

    def greedy(batch, steps=8):
        caches = [model.new_cache(32) for _ in batch]
        with torch.inference_mode():
            logits = torch.stack([runner.run(Batch([p], [c]))[0] for p, c in zip(batch, caches)])  # prefill alone
            out = [[int(t)] for t in logits.argmax(-1)]
            for _ in range(steps - 1):
                logits = runner.run(Batch([[o[-1]] for o in out], caches))
                for o, t in zip(out, logits.argmax(-1)):
                    o.append(int(t))
        return out

    together = greedy(prompts)
    assert together == [greedy([p])[0] for p in prompts]


@needs_kernels
def test_a_long_prompt_multiplies_fp32_activations_by_the_dequantized_weights():
    """In the AVX2 form and under the torch reference, past OURS_ROWS rows a w8a layer's product is the fp32
    GEMM over its weights dequantized once (the plan names it; the prompt's rows keep their fp32
    activations); in a vpdpbusd form (plan.EVERY_ROW_FORMS) the integer kernels take every row count."""
    torch.manual_seed(0)
    linear = nn.Linear(576, 200, bias=True)
    x = torch.randn(1, plan.OURS_ROWS + 40, 576)
    for cls, ref in ((Int8W8ALinear, lambda l: cpu_qdot.unpack_int8(l.weight_int8).float() * l.scale[:, None]),
                     (Int4W8ALinear, lambda l: cpu_qdot.unpack_int4(l.weight_q4).float()
                      * cpu_qdot.int4_parts(l.weight_q4)[1].float().repeat_interleave(32, 1)
                      + cpu_qdot.int4_parts(l.weight_q4)[2].float().repeat_interleave(32, 1))):
        layer = cls.from_linear(linear)
        assert torch.allclose(layer.dequantized(), ref(layer), rtol=1e-6, atol=1e-7)
        assert plan._linear_plan(layer, "cpu", capabilities.detect(), None, None, True, "avx512-vnni").kernel(
            x.shape[1]) is Kernel.WO_INT8ACT
        for form in ("avx2", None):  # the AVX2 form and the reference: past OURS_ROWS, the fp32 GEMM
            lp = plan._linear_plan(layer, "cpu", capabilities.detect(), None, None, True, form)
            assert lp.kernel(x.shape[1]) is Kernel.WO_DEQUANT_FP32
        kernel = lp.kernel(x.shape[1])
        assert kernel is Kernel.WO_DEQUANT_FP32 and lp.per_sequence(kernel)
        with torch.inference_mode():
            got = catalogue.run(kernel, layer, x)
            want = x @ ref(layer).T + linear.bias
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5
        assert lp.kernel(1) is Kernel.WO_INT8ACT


def test_a_w8a_variant_of_a_bf16_model_computes_in_fp32_through_the_cpp_loop(tiny_model_dir):
    """A bf16 model's w8a variant widens its norms, embedding and rotary tables to fp32 (its own copies:
    the base keeps its bf16 tensors), so the plan runs its layers in one C++ call; it decodes."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    base = load(LoadConfig(model=str(tiny_model_dir), dtype="bf16", device="cpu", progress=False))
    embed = base.model.embed.weight
    loaded, runner = build(base, "int4w8a+head8")
    assert loaded.dtype == torch.float32 and loaded.model.dtype == torch.float32
    floats = [t for t in [*loaded.model.parameters(), *loaded.model.buffers()] if t.is_floating_point()]
    assert floats and all(t.dtype == torch.float32 for t in floats)
    assert base.model.embed.weight is embed and embed.dtype == torch.bfloat16  # the base is untouched
    assert torch.equal(loaded.model.embed.weight, embed.float())  # widened exactly
    if runner.plan.w8a_form is not None and cpu_gemm.available():
        assert runner.plan.layer_loop == "cpp", runner.plan.reasons
    cache = runner.new_cache(8)
    logits = runner.forward(torch.tensor([1, 2, 3]), cache)
    assert cache.length == 3 and torch.isfinite(logits).all()


@needs_kernels
@pytest.mark.parametrize("variant", ["int4w8a+head8", "int8w8a+head"])
def test_a_decode_steps_final_norm_folds_into_the_heads_product_with_the_same_bits(bundled, variant):
    """The plan folds a decode step's final norm into the w8a head's activation quantizer (`head_norm`);
    its logits, one sequence and a batch of two, are torch.equal to the norm's then the head's product
    (the same runner with head_norm off). A head that is not a w8a layer keeps the norm as an op."""
    v, runner = build(bundled, variant)
    assert runner.plan.head_norm and runner.plan.describe()["head_norm"] is True
    plain = Runner(v.model, replace(runner.plan, head_norm=False))
    prompts = [[1, 504, 3458, 30, 17], [1, 2683, 314]]

    def steps(r):
        caches = [v.model.new_cache(16) for _ in prompts]
        out = []
        with torch.inference_mode():
            for p, c in zip(prompts, caches):
                r.run(Batch([p], [c]))
            out.append(r.run(Batch([[7]], caches[:1])))
            out.append(r.run(Batch([[11], [13]], caches)))
        return out

    for folded, unfolded in zip(steps(runner), steps(plain)):
        assert folded.dtype == torch.float32 and torch.equal(folded, unfolded)
    assert not build(bundled, "int4w8a")[1].plan.head_norm  # an fp32 head: the norm, then its own kernel


@needs_kernels
def test_a_w8a_product_between_onednn_bf16_matmuls_leaves_theirs_the_same():
    """On an AMX Xeon oneDNN's bf16 matmuls run on AMX tiles too, on the same threads as ours: our tiles'
    configuration is set for each panel and the thread's own given back (cpu_qdot_amx.cpp `rows`), so
    neither side dies on the other's tile shapes (an illegal instruction) nor reads its sums wrong."""
    torch.manual_seed(0)
    lin = nn.Linear(576, 1536, bias=False).to(torch.bfloat16)
    if catalogue.packed_weight(lin) is None:
        pytest.skip("oneDNN does not pack bf16 weights on this CPU (no bf16 matmul of its own to interleave)")
    (_, _), p4 = _weights(200, 576, seed=4)
    x, xa = torch.randn(1, 64, 576).to(torch.bfloat16), torch.randn(40, 576)
    form = cpu_qdot.best_form(capabilities.detect())
    with torch.inference_mode():
        first = catalogue.run(Kernel.ONEDNN_PACKED, lin, x)
        ours = cpu_qdot.int4_w8a(xa, p4, form)
        for _ in range(5):
            assert torch.equal(cpu_qdot.int4_w8a(xa, p4, form), ours)
            assert torch.equal(catalogue.run(Kernel.ONEDNN_PACKED, lin, x), first)
