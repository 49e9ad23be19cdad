"""The integer kernels' weight stream (engine/runtime/plan.py w8a_hardware_stream): whether a weight kind's row
kernels ask for their weights 4 KB ahead or leave the stream to the hardware's prefetchers is the plan's rule,
from the CPU's vendor and family (cpu_qdot.HARDWARE_STREAM_CPUS), forced here for each CPU class; the runner
tells the layers and the C++ layer loop; and a prefetch only moves data between caches, so both give the
same bits."""

from dataclasses import replace

import pytest
import torch

from engine.kernels import cpu_qdot
from engine.platform import capabilities
from engine.quant.w8a import _W8ALinear
from engine.runtime import plan
from engine.runtime.runner import Batch, Runner
from engine.serving.variants import build

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
needs_kernels = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (test_cpu_gemm asserts they build)")
AVX512 = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni")
# (vendor, family, flags) -> the weight kinds left to the hardware's prefetchers
CLASSES = {
    "zen4": (("AuthenticAMD", 25, AVX512), (2,)),
    "zen3": (("AuthenticAMD", 25, ("avx2", "fma", "f16c")), ()),  # the same family, no AVX-512
    "zen5": (("AuthenticAMD", 26, AVX512), ()),  # not measured: the default
    "xeon": (("GenuineIntel", 6, AVX512 + ("amx_tile", "amx_int8")), ()),
    "unknown": (("", None, AVX512), ()),
}


def _caps(vendor, family, isa):
    return replace(capabilities.detect(), cpu_vendor=vendor, cpu_family=family, isa=isa)


def test_this_machine_reports_its_vendor_and_family_where_proc_cpuinfo_has_them():
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo on this system")
    caps = capabilities.detect()
    assert caps.cpu_vendor and caps.cpu_vendor in text
    assert caps.cpu_family is not None and f"cpu family\t: {caps.cpu_family}" in text


@pytest.mark.parametrize("cpu", sorted(CLASSES))
def test_the_rule_leaves_the_4bit_stream_to_the_hardware_on_zen4_only(cpu):
    (vendor, family, isa), want = CLASSES[cpu]
    kinds, why = plan.w8a_hardware_stream(_caps(vendor, family, isa))
    assert kinds == want
    assert ("Zen 4" in why) == bool(want)


@needs_kernels
@pytest.mark.parametrize("k", [64, 576, 1536])
def test_each_form_gives_the_same_bits_with_and_without_the_prefetch(k):
    gen = torch.Generator().manual_seed(k)
    n = 136  # 8 whole groups of 16 channels and a last one of 8: the last group never prefetches
    q8, s8 = cpu_qdot.quantize_int8(torch.randn(n, k, generator=gen) * 0.05)
    p4 = cpu_qdot.pack_int4(torch.randint(0, 16, (n, k), generator=gen), torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3,
                            torch.randn(n, k // 32, generator=gen) * 0.01)
    norm = torch.rand(k, generator=gen) + 0.5
    assert cpu_qdot.code("avx2", False) == cpu_qdot.ISAS["avx2"][0] | cpu_qdot.HARDWARE_STREAM
    for form in [f for f in cpu_qdot.ISAS if f in cpu_qdot.cpu_isas()]:
        for rows in (1, 3, 20):
            x = torch.randn(rows, k, generator=gen) * 2
            for fetch in (False, True):  # each against the other, and against the reference
                a = cpu_qdot.int8_w8a(x, q8, s8, form, fetch)
                b = cpu_qdot.int4_w8a(x, p4, form, fetch)
                c = cpu_qdot.normed_w8a(x, norm, 1e-5, [p4], 2, None, form, fetch)
                if fetch:
                    assert torch.equal(a, a0) and torch.equal(b, b0) and torch.equal(c, c0), (form, rows)
                a0, b0, c0 = a, b, c
            ref = cpu_qdot.int4_reference(x, p4)
            assert float((b - ref).abs().max() / ref.abs().max()) < 1e-5


@needs_kernels
def test_the_runner_tells_each_layer_and_the_layer_loop_its_kinds_stream_and_both_decode_the_same_bits(bundled):
    """int4w8a+head8: 4-bit layers and an int8 head. On a Zen 4 the plan leaves the 4-bit layers' stream to the
    hardware and the head keeps the prefetch; on a Xeon every kernel prefetches; the same logits bit for bit."""
    model = build(bundled, "int4w8a+head8")[0].model
    form = cpu_qdot.best_form(capabilities.detect())
    layers = [m for m in model.modules() if isinstance(m, _W8ALinear)]
    logits = {}
    here = capabilities.detect().isa
    zen4 = CLASSES["zen4"][0][:2]
    zen4_flag = next(flag for *cpu, flag, _, _ in cpu_qdot.HARDWARE_STREAM_CPUS if tuple(cpu) == zen4)  # the rule's
    for cpu in ("zen4", "xeon"):
        (vendor, family, _), want = CLASSES[cpu]
        # this CPU's own flags (its form runs here), with the rule's Zen 4 flag for the Zen 4: on a CPU without
        # AVX-512 (qemu's Haswell) the rule still sees a Zen 4; the form stays this CPU's (asserted below)
        isa = here + (zen4_flag,) * (cpu == "zen4" and zen4_flag not in here)
        p = plan.make_plan(model, caps=_caps(vendor, family, isa))
        assert p.w8a_form == form and p.w8a_hardware_stream == want
        says = p.decision("w8a weight stream").choice
        assert ("4-bit: hardware prefetchers" in says) == (cpu == "zen4") and "int8: prefetch 4 KB ahead" in says
        runner = Runner(model, p)
        assert {(m.KIND, m.prefetch) for m in layers} == ({(2, False), (1, True)} if cpu == "zen4" else {(2, True), (1, True)})
        loop, _, head = runner._layers
        assert loop.kind == 2 and bool(loop.isa & cpu_qdot.HARDWARE_STREAM) == (cpu == "zen4")
        assert not head or not loop.head_isa & cpu_qdot.HARDWARE_STREAM  # the int8 head prefetches on both
        cache = runner.new_cache(32)
        with torch.inference_mode():
            out = [runner.run(Batch([[1, 504, 3458, 30]], [cache]))]
            out += [runner.run(Batch([[int(out[-1].argmax())]], [cache])) for _ in range(3)]
        logits[cpu] = torch.cat(out)
    assert torch.equal(logits["zen4"], logits["xeon"])
