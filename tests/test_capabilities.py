"""Every ISA-specific fast path has a fallback, and each fallback is forced here through
`capabilities.forced(...)` and checked for right results, whatever CPU runs the tests. A test of
the fast path itself skips, naming the capability, where this machine lacks it."""

import pytest
import torch
from torch import nn

from engine.bench import runner_for
from engine.core.errors import LoadError
from engine.kernels.catalogue import packed_weight, run
from engine.model.loader import resolve_dtype
from engine.platform import capabilities
from engine.quant import quantize, weight_only
from engine.quant.quantize import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from engine.runtime import activations
from engine.runtime import plan as kernel_plan
from engine.runtime.activations import probe_results, weight_only_activations
from engine.serving.variants import build

CAPS = capabilities.detect()


def project(linear, x, one_row="gemv"):
    """linear(x) through the kernel the plan's table names for x's rows (capabilities as detected now;
    `one_row` 'packed': every fp32 row through the packed copy)."""
    lp = kernel_plan._linear_plan(linear, "cpu", capabilities.detect(), one_row, None, False)
    return run(lp.kernel(x.shape[-2]), linear, x)


def test_detect_reports_this_machine_and_forced_changes_it_only_inside():
    assert CAPS.torch_cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert CAPS.isa_level in CAPS.summary()
    with capabilities.forced(onednn_bf16=False, weight_only_activations="model") as caps:
        assert capabilities.detect() is caps and not caps.packed_bf16_weights
    assert capabilities.detect() == CAPS


def test_isa_flags_are_cpuid_s_not_proc_cpuinfo_s(monkeypatch):
    """The flags are those of the CPU that runs the code: torch's cpuid reader, not /proc/cpuinfo, which
    under qemu-user (`qemu-x86_64 -cpu Haswell`, scripts/qemu_cpu_classes.sh) is the host's and lists
    AVX-512 the emulated CPU lacks: a kernel chosen from it dies with an illegal instruction."""
    cpuid = torch.cpu.get_capabilities()
    assert set(CAPS.isa) == {f for f in capabilities.ISA_FLAGS if cpuid.get(capabilities._CPUID_NAMES.get(f, f))}
    host = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}
    haswell = {"avx": True, "avx2": True, "fma3": True, "f16c": True, "avx512_f": False, "avx512_vnni": False}
    monkeypatch.setattr(capabilities, "_cpu_info", lambda: ("a host CPU", host, {}))
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: haswell)
    caps = capabilities.detect.__wrapped__()  # detected afresh, past the cache
    assert caps.isa == ("avx2", "fma", "f16c") and caps.isa_level == "AVX2" and not caps.bnb_cpu_avx512bf16
    assert len(caps.notes) == 1 and "avx512_bf16" in caps.notes[0] and "cpuid" in caps.notes[0]
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {})  # Nehalem: no AVX at all
    assert capabilities.detect.__wrapped__().isa == ()


# --- packed oneDNN bf16 weights (engine/model/fast_llama.py) ----------------------------------------------
def test_packed_weights_fall_back_to_plain_linear_without_onednn_bf16():
    lin = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    x = torch.randn(1, 5, 64).to(torch.bfloat16)
    with capabilities.forced(onednn_bf16=False):
        assert packed_weight(lin) is None
        assert torch.equal(project(lin, x), lin(x))


@pytest.mark.skipif(not CAPS.packed_bf16_weights, reason="needs oneDNN bf16 (AVX512BW/VL/DQ or AVX-NE-CONVERT), "
                    f"this CPU is {CAPS.isa_level}; the fallback test above covers it")
def test_packed_weights_where_onednn_bf16_exists():
    lin = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    x = torch.randn(1, 5, 64).to(torch.bfloat16)
    assert packed_weight(lin) is not None and torch.equal(project(lin, x), lin(x))


# --- packed oneDNN fp32 weights (few-row forwards, batched steps) ------------------------------------
def test_fp32_packed_weights_fall_back_to_plain_linear_without_onednn():
    lin = nn.Linear(64, 96, bias=True)
    x = torch.randn(1, 5, 64)
    with capabilities.forced(onednn=False):
        assert packed_weight(lin) is None
        assert torch.equal(project(lin, x), lin(x))


@pytest.mark.skipif(not CAPS.packed_fp32_weights, reason="this torch build has no oneDNN; the fallback test "
                    "above covers it")
def test_fp32_packed_weights_from_two_rows_on_give_each_row_the_same_bits_at_any_row_count():
    lin = nn.Linear(64, 96, bias=True)
    x = torch.randn(1, 9, 64)
    assert packed_weight(lin) is not None and packed_weight(lin) is packed_weight(lin)  # made once
    torch.testing.assert_close(project(lin, x), lin(x), atol=1e-5, rtol=1e-5)
    assert torch.equal(project(lin, x[:, :1]), lin(x[:, :1]))  # one row: MKL's GEMV, as before
    rows = project(lin, x)
    for i in range(9):  # what batching's exactness rests on
        assert torch.equal(project(lin, x[:, i : i + 1], "packed"), rows[:, i : i + 1])


@pytest.mark.skipif(not CAPS.packed_fp32_weights, reason="this torch build has no oneDNN; the test below covers "
                    "the model without packed weights")
def test_the_one_row_path_is_measured_cached_and_either_choice_keeps_greedy_exact(tiny, tmp_path):
    """engine/runtime/plan.py: where our kernel builds it takes one-row products by rule (nothing
    measured or cached); without it (switched off here) GEMV and the packed copy are raced, the
    packed copy kept only with a 5% lead, the choice written to the per-machine cache and read back
    the next time; whichever serves, greedy decoding is unchanged, and a lone sequence gets the bits
    of the same sequence in a batch."""
    from engine.kernels import cpu_gemm, switches
    from engine.platform import decisions
    from engine.runtime.plan import make_plan
    from engine.runtime.runner import Batch, Runner

    model = tiny.model
    if cpu_gemm.available():
        ruled = make_plan(model, cache_dir=tmp_path).decision("fp32 one-row")
        assert ruled.choice == "ours" and ruled.source.startswith("rule") and ruled.measured is None
        assert not (tmp_path / "kernel-plans").exists()
    with switches.forced_off("gemm"):
        choice = make_plan(model, cache_dir=tmp_path).decision("fp32 one-row")
        m = choice.measured
        assert choice.source == "measured" and m["packed_ms"] > 0 and m["gemv_ms"] > 0 and m["ours_ms"] is None
        assert choice.choice in ("packed", "gemv")
        assert (choice.choice == "packed") == (m["ratio"] <= kernel_plan.ONE_ROW_PACKED_IF)
        assert len(list((tmp_path / "kernel-plans").iterdir())) == 1
        decisions.forget()  # a restart: a new process has only the cache folder
        again = make_plan(model, cache_dir=tmp_path).decision("fp32 one-row")  # the cached decision, not a new race
        assert again.choice == choice.choice and again.source.startswith("cached") and again.measured == m
    ids = torch.tensor([5, 9, 13])
    outs = {}
    for path in ["gemv", "packed"] + (["ours"] if cpu_gemm.available() else []):
        runner = Runner(model, make_plan(model, one_row=path))
        cache, other = runner.new_cache(16), runner.new_cache(16)
        runner.run(Batch([ids.tolist()], [cache]))  # the same prompt KV for every path
        runner.run(Batch([[3, 4]], [other]))
        outs[path] = runner.forward(torch.tensor([21]), cache)
        cache.crop(3)
        batched = runner.run(Batch([[21], [8]], [cache, other]))  # the same row beside another
        assert torch.equal(outs[path], batched[:1])
    for path in outs:
        torch.testing.assert_close(outs["packed"], outs[path], atol=1e-4, rtol=1e-4)
        assert outs["packed"].argmax() == outs[path].argmax()


def test_fast_llama_forward_is_right_without_packed_weights(tiny):
    """The whole bf16 forward on the plain path gives the logits of the fp32 model, to bf16 precision."""
    ids = torch.arange(100, 112)
    want = runner_for(tiny).forward(ids, tiny.model.new_cache(16), all_logits=True)
    with capabilities.forced(onednn_bf16=False):
        _, bf16 = build(tiny, "bf16")  # its plan made with the capabilities forced
        got = bf16.forward(ids, bf16.new_cache(16), all_logits=True)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


# --- the auto dtype (engine/model/loader.py) ----------------------------------------------------------------
def test_auto_dtype_follows_our_fp32_kernels_native_bf16_and_cuda_bf16(monkeypatch):
    from engine.kernels import cpu_gemm

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(cpu_gemm, "unavailable_reason", lambda: None)
    with capabilities.forced(native_bf16=True):  # our fp32 kernels decode faster than the bf16 paths
        assert resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(cpu_gemm, "unavailable_reason", lambda: "switched off (LATENCY_LAB_GEMM=off)")
    with capabilities.forced(native_bf16=True):  # without them bf16's dot products win
        assert resolve_dtype("auto", cpu) == torch.bfloat16
    with capabilities.forced(native_bf16=False):  # AVX2 / plain AVX-512: bf16 is emulated
        assert resolve_dtype("auto", cpu) == torch.float32
        assert resolve_dtype("bf16", cpu) == torch.bfloat16  # asked for by name: given
    with capabilities.forced(cuda_bf16=True):
        assert resolve_dtype("auto", cuda) == torch.bfloat16
    with capabilities.forced(cuda_bf16=False):  # pre-Ampere GPUs
        assert resolve_dtype("auto", cuda) == torch.float16


# --- torch's weight-only kernels (engine/quant/quantize.py) ---------------------------------------------------
def _layer(seed=0, n=96, k=128):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=True), torch.randn(3, 5, k)


@pytest.mark.parametrize("activations", ["model", "bf16", "auto"])
@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_weight_only_kernels_are_right_in_every_activation_dtype(cls, activations):
    lin, x = _layer()
    method = "int8wo" if cls is Int8WeightOnlyLinear else "int4wo"
    with capabilities.forced(weight_only_activations=activations):
        dtype = weight_only_activations(method, "cpu", torch.float32)  # the plan's decision
    q = cls.from_linear(lin, compute_dtype=dtype, keep_unpacked=True, ours_layout=False)  # torch's; ours: test_cpu_gemm
    if activations == "model":
        assert q.compute_dtype == torch.float32  # the fallback: the model's own dtype
    if activations == "bf16":
        assert q.compute_dtype == torch.bfloat16
    y = q(x)
    assert y.dtype == x.dtype and y.shape == (3, 5, 96)  # cast back: the model keeps its dtype
    want = x @ q.dequantized().T + q.bias
    tol = 1e-4 if q.compute_dtype == torch.float32 else 2e-2
    assert (y - want).abs().max() <= tol * want.abs().max()


def test_weight_only_activation_dtype_measured_once_and_reported(tmp_path):
    from engine.platform import decisions

    first = weight_only_activations("int8wo", "cpu", torch.float32, cache_dir=tmp_path)
    assert weight_only_activations("int8wo", "cpu", torch.float32, cache_dir=tmp_path) is first
    assert first in (torch.bfloat16, torch.float32)
    assert ("int8wo", "cpu", quantize.dtype_name(first)) in probe_results
    if CAPS.weight_only_activations == "auto":  # a race was run: kept per machine, a restart reads it
        assert len(list((tmp_path / "weight-only-activations").iterdir())) == 1
        decisions.forget()
        assert weight_only_activations("int8wo", "cpu", torch.float32, cache_dir=tmp_path) is first
    # a bf16 model needs no choice: its own dtype is the kernel's fast one
    assert weight_only_activations("int8wo", "cpu", torch.bfloat16) == torch.bfloat16


@pytest.mark.parametrize("method, field", [("int8wo", "int8_weight_only_kernel"), ("int4wo", "int4_weight_only_kernel")])
def test_a_weight_only_variant_without_its_kernel_is_refused_with_advice(tiny, method, field):
    with capabilities.forced(**{field: False}):
        with pytest.raises(LoadError, match="lacks") as err:
            build(tiny, method)
    assert "pick" in str(err.value)
    assert build(tiny, method)[1].forward(torch.arange(4), tiny.model.new_cache(8)).isfinite().all()


def test_a_kernel_that_fails_its_check_is_refused_before_building(tiny, monkeypatch):
    def broken(*args):
        raise RuntimeError("no kernel for this CPU")

    activations._layers_for.cache_clear()
    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu", broken)
    try:
        with pytest.raises(LoadError, match="int4wo kernel cannot run.*no kernel for this CPU"):
            build(tiny, "int4wo")
    finally:
        monkeypatch.undo()
        activations._layers_for.cache_clear()
    assert build(tiny, "int4wo") is not None


def test_int4_needs_input_sizes_divisible_by_its_group(odd_model):
    with pytest.raises(LoadError, match=f"divisible by {weight_only.INT4_GROUP_SIZE}.*Try int8wo"):
        build(odd_model, "int4wo")
    assert build(odd_model, "int8wo") is not None  # no such rule


def test_lm_head_variants_quantize_a_copy_and_keep_the_embedding(tiny):
    v, runner = build(tiny, "int8wo+head")
    assert isinstance(v.model.lm_head, Int8WeightOnlyLinear)
    assert v.model.embed.weight is tiny.model.embed.weight  # the lookup reads the original
    ids = torch.arange(100, 110)
    want = runner_for(tiny).forward(ids, tiny.model.new_cache(16), all_logits=True)
    got = runner.forward(ids, v.model.new_cache(16), all_logits=True)
    assert (got - want).abs().max() < 0.1 * want.abs().max()


# --- bitsandbytes' 4-bit CPU kernel (AVX512-BF16 needs rows % 32) ------------------------------------------
@pytest.fixture(scope="module")
def odd_model(tmp_path_factory, tokenizer):
    """A tiny Llama with 48-wide layers: neither bitsandbytes' AVX512-BF16 4-bit kernel nor int4wo take them."""
    from conftest import build_tiny_model_dir

    from engine.core.config import LoadConfig
    from engine.model.loader import load

    path = build_tiny_model_dir(tmp_path_factory.mktemp("odd-llama"), tokenizer, hidden_size=48)
    return load(LoadConfig(model=str(path), dtype="fp32", progress=False))


@pytest.mark.skipif(CAPS.bnb_unusable is not None, reason="bitsandbytes cannot load on this CPU (no AVX2): "
                    "test_bitsandbytes_is_refused_up_front_where_importing_it_would_crash covers it")
def test_bnb_4bit_shape_rule_is_checked_where_its_avx512bf16_kernel_runs(odd_model):
    """Forced on, the rule refuses before any kernel runs, on any CPU."""
    with capabilities.forced(bnb_cpu_avx512bf16=True):
        with pytest.raises(LoadError, match="divisible by 32.*Try int8"):
            build(odd_model, "nf4")


@pytest.mark.skipif(CAPS.bnb_cpu_avx512bf16 or CAPS.bnb_unusable is not None,
                    reason="this CPU has AVX512-BF16, where bitsandbytes' 4-bit kernel has the shape rule (the forced "
                    "test above covers it), or no AVX2, where bitsandbytes cannot load (refused up front, tested)")
def test_bnb_4bit_generic_kernel_takes_any_shape(odd_model):
    v, runner = build(odd_model, "nf4")
    logits = runner.forward(torch.arange(4), v.model.new_cache(8))
    assert logits.isfinite().all()


def test_bitsandbytes_is_refused_up_front_where_importing_it_would_crash(bundled):
    """On an x86 CPU without AVX2, importing bitsandbytes dies with SIGILL: its variants must be
    refused with the reason before anything imports it (the page then does not offer them)."""
    from engine.quant.quantize import precheck

    reason = capabilities._bitsandbytes_unusable("DEFAULT", cuda=False)
    assert reason and "AVX2" in reason
    assert capabilities._bitsandbytes_unusable("AVX2", cuda=False) is None
    with capabilities.forced(bnb_unusable=reason):
        for name in ("int8", "nf4", "fp4"):
            why = precheck(bundled, name)
            assert why and "AVX2" in why and "int8wo" in why, name
        assert precheck(bundled, "int8wo") is None
