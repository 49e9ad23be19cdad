"""Our AVX2 weight-only kernels (engine/kernels/cpu_gemm.py): right at every row count where they run,
used by the weight-only layers for every row count, and a named fallback to torch's kernels
where they cannot run."""

import pytest
import torch
from torch import nn

from engine.kernels import cpu_gemm
from engine.platform import capabilities
from engine.quant.weight_only import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from engine.runtime.activations import weight_only_activations

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))



@pytest.fixture(autouse=True, scope="module")
def _built():
    """Build (or load) the kernels first, whichever test runs alone."""
    cpu_gemm.unavailable_reason()

def test_the_kernels_run_wherever_this_machine_can_build_them():
    """No silent fallback: with AVX2 and a compiler (CI has both) they must build and pass their check."""
    reason = cpu_gemm.unavailable_reason()
    if CAN_BUILD:
        assert reason is None
    else:
        assert reason and ("AVX2" in reason or "compiler" in reason)


needs_kernels = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (asserted above)")


@needs_kernels
@pytest.mark.parametrize("k", [96, 1536])
def test_both_kernels_equal_the_dequantized_product_at_every_row_count(k):
    gen = torch.Generator().manual_seed(k)
    n = 101  # not a multiple of the threads' row split
    w = torch.randn(n, k, generator=gen) * 0.05
    q8, s8 = cpu_gemm.quantize_int8(w)
    q4 = torch.randint(0, 16, (n, k), generator=gen)
    scale, zero = torch.rand(n, k // 32, generator=gen) * 0.01, torch.randn(n, k // 32, generator=gen) * 0.01
    packed, s16, o16 = cpu_gemm.pack_int4(q4, scale, zero)
    w4 = q4.float() * s16.float().repeat_interleave(32, 1) + o16.float().repeat_interleave(32, 1)
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 13):  # row blocks of 4 and their remainders
        x = torch.randn(m, k, generator=gen)
        want8, want4 = x @ (q8.float() * s8[:, None]).T, x @ w4.T
        got8, got4 = cpu_gemm.int8_gemv(x, q8, s8), cpu_gemm.int4_gemv(x, packed, s16, o16)
        assert got8.shape == got4.shape == (m, n)
        assert (got8 - want8).abs().max() <= 1e-5 * want8.abs().max()
        assert (got4 - want4).abs().max() <= 1e-3 * want4.abs().max()  # int16 activations
        if m > 1:  # a row's result does not depend on how many rows share the call
            assert torch.equal(cpu_gemm.int4_gemv(x[:1].contiguous(), packed, s16, o16)[0], got4[0])


@needs_kernels
@pytest.mark.parametrize("k", [576, 1000])
def test_the_fp32_kernel_equals_the_product_and_a_row_its_bits_at_any_row_count(k):
    gen = torch.Generator().manual_seed(k)
    w = torch.randn(203, k, generator=gen)  # 13 panels of 16: pairs, a lone one, the last one padded
    x = torch.randn(13, k, generator=gen)
    panels = cpu_gemm.fp32_panels(w)
    assert panels.shape == (13, k, cpu_gemm.PANEL)
    got = cpu_gemm.fp32_mm(x, panels, 203)
    assert got.shape == (13, 203)
    assert (got - x @ w.T).abs().max() <= 1e-5 * (x @ w.T).abs().max()
    for m in range(1, 13):  # blocks of 3 (AVX2) or 8 rows (AVX-512) and their remainders: batching's exactness rests on this
        assert torch.equal(cpu_gemm.fp32_mm(x[:m].contiguous(), panels, 203), got[:m])
    if cpu_gemm.wide_fp32():  # the AVX-512 kernel gives the AVX2 one's bits: a machine's CPU never changes a reply
        for m in (1, 5, 13):
            assert torch.equal(torch.ops.latency_lab_gemv.fp32_mm(x[:m].contiguous(), panels, 203, False), got[:m])
    assert torch.equal(cpu_gemm.fp32_mm(x[7:8].contiguous(), panels, 203)[0], got[7])
    with torch.inference_mode():  # and on either thread count: each output is one thread's
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert torch.equal(cpu_gemm.fp32_mm(x, panels, 203), got)
        finally:
            torch.set_num_threads(threads)


@needs_kernels
def test_bf16_panels_give_the_fp32_product_of_the_bf16_weights_and_a_bf16_linears_rounding():
    """A bf16 Linear's one-row products stream its bf16 weights through the same panel kernel (each weight
    widened exactly): the fp32 product of those weights, in the fp32 kernel's order, at any row count and
    either vector width; `ours` on a bf16 Linear rounds it to bf16 once, as a bf16 matmul does."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(203, 576, generator=gen).bfloat16()
    x = torch.randn(9, 576, generator=gen)
    panels = cpu_gemm.fp32_panels(w)
    assert panels.dtype == torch.bfloat16 and panels.shape == (13, 576, cpu_gemm.PANEL)
    got = cpu_gemm.fp32_mm(x, panels, 203)
    assert torch.equal(got, cpu_gemm.fp32_mm(x, cpu_gemm.fp32_panels(w.float()), 203))  # widened exactly
    for m in (1, 2, 5):
        assert torch.equal(cpu_gemm.fp32_mm(x[:m].contiguous(), panels, 203), got[:m])
        if cpu_gemm.wide_fp32():
            assert torch.equal(torch.ops.latency_lab_gemv.fp32_mm(x[:m].contiguous(), panels, 203, False), got[:m])
    linear = nn.Linear(576, 203, bias=True).bfloat16()
    xb = x[:1].bfloat16()
    with torch.inference_mode():
        y = cpu_gemm.ours(linear, xb)
        want = (xb.float() @ linear.weight.float().T + linear.bias.float()).bfloat16()
        aten = nn.functional.linear(xb, linear.weight, linear.bias)
    assert y.dtype == torch.bfloat16 and y.shape == (1, 203)
    # the fp32 sums rounded once: within one bf16 step (2^-7 relative) of the product rounded in torch's
    # order, and of ATen's own bf16 matmul (two roundings of nearly equal sums differ by at most a step)
    for other in (want, aten):
        assert ((y.float() - other.float()).abs() <= other.float().abs() * 2**-7 + 1e-6).all()


@needs_kernels
def test_a_kernel_refuses_a_shape_it_cannot_take():
    with pytest.raises(RuntimeError, match=r"x must be \[M, 64\]"):
        cpu_gemm.int8_gemv(torch.randn(2, 63), torch.zeros(8, 64, dtype=torch.int8), torch.ones(8))
    with pytest.raises(RuntimeError, match="groups of 32"):
        cpu_gemm.int4_gemv(torch.randn(1, 48), torch.zeros(8, 24, dtype=torch.uint8),
                           torch.ones(8, 1).half(), torch.ones(8, 1).half())
    with pytest.raises(RuntimeError, match="panels must be"):  # panels for fewer outputs than asked
        cpu_gemm.fp32_mm(torch.randn(2, 64), cpu_gemm.fp32_panels(torch.randn(16, 64)), 17)


@needs_kernels
@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_layers_take_our_kernel_at_any_row_count(cls):
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=True)
    dtype = weight_only_activations("int8wo" if cls is Int8WeightOnlyLinear else "int4wo", "cpu", torch.float32)
    ours, theirs = cls.from_linear(linear, compute_dtype=dtype), cls.from_linear(linear, compute_dtype=dtype,
                                                                                 ours_layout=False)
    assert ours.has_ours and not theirs.has_ours
    few, many = torch.randn(1, 3, 256), torch.randn(1, 40, 256)
    with torch.inference_mode():
        assert torch.equal(ours(many)[:, 5:6], ours(many[:, 5:6]))  # a prefill row == the same row decoded alone
        got, want = ours(few), theirs(few)
        exact = linear(few)
    assert not torch.equal(got, want)  # a different kernel ran ...
    # ... and ours is no further from the fp32 product than torch's (bf16 activations here)
    assert (got - exact).abs().max() <= (want - exact).abs().max() * 1.5 + 1e-4


def test_turned_off_the_layers_use_torchs_kernels_and_say_why(tiny, monkeypatch):
    from engine.serving.variants import build

    monkeypatch.setenv("LATENCY_LAB_GEMV", "off")
    layer = Int8WeightOnlyLinear.from_linear(nn.Linear(64, 32), compute_dtype=torch.float32)
    assert not layer.has_ours
    loaded, runner = build(tiny, "int8wo")  # built and planned with our kernels off
    assert not loaded.model.blocks[0].qkv.has_ours
    assert "LATENCY_LAB_GEMV=off" in runner.plan.weight_only_text
    assert "torch._weight_int8pack_mm (" in cpu_gemm.kernel_name("int8wo")


def test_without_a_compiler_the_reason_says_what_to_install():
    cpu_gemm._build.cache_clear()
    try:
        with capabilities.forced(cpp_compiler=None, torch_cpu_capability="AVX2"):
            assert "C++ compiler" in cpu_gemm.unavailable_reason()
        cpu_gemm._build.cache_clear()
        with capabilities.forced(torch_cpu_capability="DEFAULT"):
            assert "AVX2" in cpu_gemm.unavailable_reason()
    finally:
        cpu_gemm._build.cache_clear()  # the next caller loads the built library again


@needs_kernels
def test_a_weight_only_variant_decodes_with_the_kernels_measured_faster_and_says_which(bundled):
    """Built, a variant's plan races a decode step through our kernels and through torch's and keeps the
    faster (ours on a tie); engine info names the choice, its quality is measured on it, and either
    choice decodes (nearly) the same logits."""
    from engine.kernels.catalogue import Kernel
    from engine.runtime.plan import make_plan
    from engine.runtime.runner import Runner
    from engine.serving.variants import VariantSet

    variants = VariantSet(bundled, quality_texts=1)
    variant = variants.get("int8wo+head")
    model, plan = variant.loaded.model, variant.runner.plan
    chosen = plan.decision("weight-only kernels")
    info = next(v for v in variants.infos() if v.name == "int8wo+head")
    layers = [m for m in model.modules() if isinstance(m, Int8WeightOnlyLinear)]
    assert all(m.has_ours for m in layers)
    want = Kernel.WO_OURS if chosen.choice == "ours" else Kernel.WO_TORCH
    assert all(plan.linears[role].kernel(n) is want for role in plan.linears for n in (1, 7))
    if chosen.choice == "ours":
        assert info.decode_kernels.startswith("latency_lab AVX2")
    else:
        assert info.decode_kernels.startswith("torch's weight-only kernels: a decode step measured faster")
    assert info.top1_agreement is not None and info.top1_agreement >= 0.9  # measured on the chosen kernels
    assert any(chosen.choice in note and "decode kernels" in note for note in variant.loaded.notes)
    ids = torch.tensor([5, 9, 13])
    logits = {}
    for kernels in ("ours", "torch"):  # the same weights, each plan's kernels
        runner = Runner(model, make_plan(model, weight_only=kernels))
        logits[kernels] = runner.forward(ids, runner.new_cache(8))
    assert logits["ours"].argmax() == logits["torch"].argmax()
    # torch's kernel may take bf16 activations (weight_only_activations): ~1e-2 a layer, over 30 layers
    assert (logits["ours"] - logits["torch"]).abs().max() <= 0.1 * logits["ours"].abs().max()


@needs_kernels
def test_the_weight_only_race_is_kept_per_machine_and_a_restart_takes_it(bundled, tmp_path, monkeypatch):
    """The faster of ours and torch's kernels changes a variant's bits: raced once on this machine,
    kept in the cache folder, and a second build in a new process (a restart) takes the kept decision,
    not a new race."""
    from dataclasses import replace

    from engine.kernels.catalogue import Kernel
    from engine.platform import decisions
    from engine.runtime import plan as kernel_plan
    from engine.serving.variants import build

    first, runner = build(replace(bundled, cache_dir=tmp_path), "int8wo")
    kept = runner.plan.decision("weight-only kernels")
    assert kept.source == "measured" and kept.choice in ("ours", "torch")
    assert len(list((tmp_path / "weight-only-kernels").iterdir())) == 1

    def no_race(*args, **kwargs):
        raise AssertionError("raced again although this machine's decision is kept")

    monkeypatch.setattr(kernel_plan, "race_weight_only", no_race)
    decisions.forget()  # a restart: the cache folder is all that is left
    again, runner = build(replace(bundled, cache_dir=tmp_path), "int8wo")
    chosen = runner.plan.decision("weight-only kernels")
    assert chosen.choice == kept.choice and chosen.source.startswith("cached (")
    want = Kernel.WO_OURS if kept.choice == "ours" else Kernel.WO_TORCH
    assert runner.plan.linears["qkv"].kernel(1) is want
    assert any(chosen.source in note for note in again.notes)
