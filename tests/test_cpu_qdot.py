"""Our integer dot-product kernels (engine/kernels/cpu_qdot.py) and the w8a variants built on them:
every form this CPU runs equals the reference arithmetic and the other forms bit for bit, a row's
result does not depend on the rows beside it, the form is chosen from the capabilities with each
fallback reachable (forced here for the CPU classes this machine is not), and every form decodes a w8a variant
with the same bits. The variants' own behaviour (alone and batched, long prompts, the head's folded norm):
tests/test_w8a_variants.py."""

from dataclasses import replace

import pytest
import torch
from torch import nn

from engine.kernels import cpu_gemm, cpu_qdot
from engine.platform import capabilities
from engine.quant import w8a
from engine.quant.w8a import Int8W8ALinear
from engine.runtime import plan
from engine.runtime.runner import Batch, Runner
from engine.serving.variants import build

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
needs_kernels = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (test_cpu_gemm asserts they build)")
AVX2_ONLY = ("avx2", "fma", "f16c")  # a Zen 3 / Haswell-class CPU's flags, as capabilities names them


def _forms():
    return [f for f in cpu_qdot.ISAS if f in cpu_qdot.cpu_isas()]


def _weights(n, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    q8, s8 = cpu_qdot.quantize_int8(w)
    q4 = torch.randint(0, 16, (n, k), generator=gen)
    packed = cpu_qdot.pack_int4(q4, torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3,
                                torch.randn(n, k // 32, generator=gen) * 0.01)
    return (q8, s8), packed


@needs_kernels
def test_every_form_this_cpu_runs_passed_its_check_and_the_best_is_chosen():
    forms = _forms()
    assert "avx2" in forms  # every CPU our extension builds on
    assert all(cpu_qdot._checked()[f] is None for f in forms)
    want = next(f for f in cpu_qdot.ISAS if f in forms and set(cpu_qdot.ISAS[f][1]) <= set(capabilities.detect().isa))
    assert cpu_qdot.best_form(capabilities.detect()) == want


@needs_kernels
# a chunk of 8 blocks and none; every partial last chunk (T = 1..7 blocks); the model's sizes
@pytest.mark.parametrize("k", [32, 64, 96, 128, 160, 192, 224, 256, 288, 480, 576, 1536])
def test_each_form_equals_the_reference_and_the_others_bit_for_bit(k):
    (q8, s8), p4 = _weights(136, k)
    x = torch.randn(35, k) * 2  # AMX: two 16-row tiles, then 3 rows through the row kernels
    x[1, :32] = 0  # an all-zero block
    for what, run, ref in (("int8", lambda f: cpu_qdot.int8_w8a(x, q8, s8, f), cpu_qdot.int8_reference(x, q8, s8)),
                           ("int4", lambda f: cpu_qdot.int4_w8a(x, p4, f),
                            cpu_qdot.int4_reference(x, p4))):
        results = [run(f) for f in _forms()]
        for got in results:
            assert float((got - ref).abs().max() / ref.abs().max()) < 1e-5, what
            assert torch.equal(got, results[0]), f"{what}: the forms differ in their bits"


@needs_kernels
def test_activations_are_quantized_as_the_reference_does_bit_for_bit():
    x = torch.randn(5, 320, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 320)
    got = torch.ops.latency_lab_gemv.qdot_quantize(x)
    want = cpu_qdot.quantize_reference(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    scale = x.abs().reshape(5, 10, 32).sum(-1)  # the block sums: only the summation order differs
    assert ((got[2] - want[2]).abs() <= 1e-6 * scale).all()


def test_4bit_groups_hold_16_channels_weights_then_their_scales_and_offsets_a_block():
    # the kernels read a group in address order (cpu_qdot.h): per block 4 pieces of 64 bytes (channel l's
    # bytes 4j..4j+3 of the block at 64j + 4l), 16 fp16 scales, 16 fp16 offsets; a last group of R < 16
    # channels the same with R lanes (20R bytes a block)
    gen = torch.Generator().manual_seed(3)
    n, k, g = 19, 96, 3  # a whole group of 16 and a last one of 3; 3 blocks
    q4 = torch.randint(0, 16, (n, k), generator=gen)
    scale, zero = torch.rand(n, g, generator=gen) * 0.01 + 1e-3, torch.randn(n, g, generator=gen) * 0.01
    rows = cpu_qdot.pack_int4(q4, scale, zero)
    weights, s16, o16 = cpu_gemm.pack_int4(q4, scale, zero)
    assert rows.shape == (n, k // 2 + k // 8)
    flat = rows.reshape(-1)
    for c0, r in ((0, 16), (16, 3)):
        for b in range(g):
            rec = flat[c0 * 60 + b * 20 * r:c0 * 60 + (b + 1) * 20 * r]
            for l in range(r):
                for j in range(4):
                    assert torch.equal(rec[4 * r * j + 4 * l:4 * r * j + 4 * l + 4], weights[c0 + l, 16 * b + 4 * j:16 * b + 4 * j + 4])
            assert torch.equal(rec[16 * r:18 * r].contiguous().view(torch.float16), s16[c0:c0 + r, b])
            assert torch.equal(rec[18 * r:].contiguous().view(torch.float16), o16[c0:c0 + r, b])
    parts = cpu_qdot.int4_parts(rows)
    assert torch.equal(parts[0], weights) and torch.equal(parts[1], s16) and torch.equal(parts[2], o16)


def test_int8_groups_hold_16_channels_4_byte_pieces_a_block():
    # per block 8 pieces of 64 bytes: channel l's bytes 4s..4s+3 of the block at 64s + 4l; a last group of
    # R < 16 channels the same with R lanes (32R bytes a block)
    gen = torch.Generator().manual_seed(4)
    n, k, g = 19, 96, 3  # a whole group of 16 and a last one of 3; 3 blocks
    w = torch.randn(n, k, generator=gen)
    grouped, scale = cpu_qdot.quantize_int8(w)
    q, want_scale = cpu_gemm.quantize_int8(w)
    assert grouped.shape == (n, k) and torch.equal(scale, want_scale)
    flat = grouped.reshape(-1)
    for c0, r in ((0, 16), (16, 3)):
        for b in range(g):
            rec = flat[c0 * k + b * 32 * r:c0 * k + (b + 1) * 32 * r]
            for l in range(r):
                for s in range(8):
                    assert torch.equal(rec[4 * r * s + 4 * l:4 * r * s + 4 * l + 4], q[c0 + l, 32 * b + 4 * s:32 * b + 4 * s + 4])
    assert torch.equal(cpu_qdot.unpack_int8(grouped), q)


@needs_kernels
@pytest.mark.parametrize("form", ["avx2", "avx512-vnni", "amx-int8"])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(form):
    if form not in _forms():
        pytest.skip(f"this CPU does not run {form} (test_forced_* covers the choice)")
    (q8, s8), p4 = _weights(200, 576, seed=1)
    x = torch.randn(40, 576)
    for run in (lambda a: cpu_qdot.int8_w8a(a, q8, s8, form), lambda a: cpu_qdot.int4_w8a(a, p4, form)):
        full = run(x)
        for m in (1, 2, 3, 4, 5, 9, 16, 17, 33):  # AMX: rows in a 16-row tile, past it, in a second one
            assert torch.equal(run(x[:m].contiguous()), full[:m])
        assert torch.equal(run(x[7:8].contiguous()), full[7:8])  # a decode row == the same row in a prefill
        assert torch.equal(run(x[20:36].contiguous()), full[20:36])  # a tile of rows that sat across two


def _caps(**changes):
    return replace(capabilities.detect(), **changes)


@needs_kernels
def test_forced_avx2_cpu_takes_the_avx2_form():
    assert cpu_qdot.best_form(_caps(isa=AVX2_ONLY)) == "avx2"


@needs_kernels
def test_forced_avx_vnni_is_taken_only_where_cpuid_confirms_it():
    """AVX-VNNI (Alder Lake, Zen 5) is chosen only where the CPU itself runs it: /proc/cpuinfo may show a
    host's flags under an emulator. On a CPU without it the forced flag falls back to AVX2."""
    got = cpu_qdot.best_form(_caps(isa=(*AVX2_ONLY, "avx_vnni")))
    assert got == ("avx-vnni" if "avx-vnni" in cpu_qdot.cpu_isas() else "avx2")


@needs_kernels
def test_a_form_that_fails_its_check_gives_way_to_the_next(monkeypatch):
    """Each form failing its check (a wrong result, a missing instruction) in turn, best first, leaves the
    next one this CPU runs and its capabilities list, down to AVX2: every fallback of this CPU's class is
    reachable (AMX -> 512-bit VNNI -> its 256-bit form -> ... on an AMX Xeon)."""
    checked, have = dict(cpu_qdot._checked()), set(capabilities.detect().isa)
    usable = [f for f in cpu_qdot.ISAS if f in _forms() and set(cpu_qdot.ISAS[f][1]) <= have]
    failed = {}
    for form, after in zip(usable, usable[1:]):
        failed[form] = "forced to fail"
        monkeypatch.setattr(cpu_qdot, "_checked", lambda: {**checked, **failed})
        assert cpu_qdot.best_form(capabilities.detect()) == after


@needs_kernels
def test_forced_cpu_without_amx_takes_the_512_bit_vnni_form():
    """An AVX-512 VNNI CPU without AMX (Ice Lake, Zen 4/5) takes the 512-bit VNNI form; AMX is taken only
    where the capabilities list it and cpuid and Linux confirm it (on a CPU without either, forced flags
    fall back to what cpuid confirms: AVX2)."""
    vnni = (*AVX2_ONLY, "avx512_vnni", "avx512vl", "avx512bw")
    want = "avx512-vnni" if "avx512-vnni" in _forms() else "avx2"  # where cpuid confirms it
    assert cpu_qdot.best_form(_caps(isa=vnni)) == want
    got = cpu_qdot.best_form(_caps(isa=(*vnni, "amx_tile", "amx_int8")))
    assert got == ("amx-int8" if "amx-int8" in _forms() else want)


def test_forced_cpu_without_avx2_serves_the_reference_and_says_so(monkeypatch):
    monkeypatch.setenv("LATENCY_LAB_GEMM", "off")  # as where the extension cannot build (no AVX2)
    assert cpu_qdot.best_form(capabilities.detect()) is None
    layer = Int8W8ALinear.from_linear(nn.Linear(64, 24, bias=False))
    assert layer.isa is None  # never told a form: the torch reference
    assert "torch reference" in plan._weight_only_text([layer], {}, None, "cpu", None)  # engine info's words
    assert "LATENCY_LAB_GEMM=off" in cpu_qdot.describe(None)
    x = torch.randn(2, 64)
    assert torch.equal(layer(x), cpu_qdot.int8_reference(x, layer.weight_int8, layer.scale))


def _decode(runner, prompts, steps=8, forced=None):
    """Each prompt's greedy tokens and every step's logits, decoded together (a batch); with `forced`
    (tokens per prompt), those tokens are fed instead of the greedy ones (teacher forcing)."""
    caches = [runner.new_cache(64) for _ in prompts]
    with torch.inference_mode():
        logits = [torch.stack([runner.run(Batch([p], [c]))[0] for p, c in zip(prompts, caches)])]
        out = [[int(t)] for t in logits[0].argmax(-1)]
        for i in range(steps - 1):
            fed = [[f[i]] for f in forced] if forced else [[o[-1]] for o in out]
            logits.append(runner.run(Batch(fed, caches)))
            for o, t in zip(out, logits[-1].argmax(-1)):
                o.append(int(t))
    return out, logits


@needs_kernels
@pytest.mark.parametrize("variant", ["int4w8a+head8", "int8w8a+head"])
def test_the_plan_chooses_each_form_from_the_capabilities_and_every_form_decodes_the_same_bits(bundled, variant):
    """The plan is the one place the form is chosen: for each CPU class forced here (this CPU's own; AVX2
    only, as Zen 3; none: no AVX2) it names the form, the runner tells the layers, and the C++ layer loop
    runs where a form does. Every form this CPU runs gives the same logits bit for bit, so the same
    greedy tokens. The torch reference (the plain path) is the same arithmetic with its float sums in
    another order, and int8 activations amplify last-bit differences: a 1e-6 relative nudge of the
    embeddings moved int8w8a+head's logits by 0.8-1.8, int4w8a+head8's (4-bit blocks) by 1.9-3.3, on
    steps whose largest logits are ~18-35, fp32's by ~1e-4 (2026-12-05, Zen 4, the prompts below); the
    reference's logits, teacher-forced, part from the kernels' by 0.4-1.0 and 1.2-3.7 (the 3.7 at a step
    whose first row peaks at only 14.6: so the bound is on the step's largest logit, not the row's). So
    the reference is not the same bits, and its greedy tokens may part at a near tie (int8w8a+head, first
    prompt: a 0.02 margin at token 6). Teacher-forced on the kernels' tokens, its logits stay within that
    amplification and it agrees on every clear top-1."""
    from engine.quant.w8a import _W8ALinear

    model = build(bundled, variant)[0].model
    layers = [m for m in model.modules() if isinstance(m, _W8ALinear)]
    # the third prompt fills two 16-row tiles and leaves 8 rows: AMX's prefill against the others' bits
    prompts = [[1, 504, 3458, 30], [1, 2683, 314, 11, 17], [1] + [(97 * i) % 4000 + 30 for i in range(39)]]
    classes = {"this cpu": (capabilities.detect().isa, cpu_qdot.best_form(capabilities.detect())),
               "avx2 only": (AVX2_ONLY, "avx2"), "no avx": ((), None)}
    runners = {}
    for name, (flags, want) in classes.items():
        p = plan.make_plan(model, caps=_caps(isa=flags))
        assert p.w8a_form == want, name
        assert p.decision("w8a kernel form").choice == (want or "torch reference")
        assert p.layer_loop == ("cpp" if want else "python"), name
        runners[name] = Runner(model, p)
        assert {m.isa for m in layers} == {want}
    # one runner per model object is the runner's contract (the last one made told the layers its form):
    # here three share one model, so each is given its plan's form again before it runs
    w8a.tell(model, classes["this cpu"][1])
    tokens, logits = _decode(runners["this cpu"], prompts)
    w8a.tell(model, "avx2")
    assert all(torch.equal(a, b) for a, b in zip(logits, _decode(runners["avx2 only"], prompts)[1]))
    w8a.tell(model, None)
    _, ref = _decode(runners["no avx"], prompts, forced=tokens)
    clear = 0
    for a, b in zip(logits, ref):
        diff = (a - b).abs().amax(-1)
        assert (diff < 0.25 * a.abs().amax()).all()  # within the amplification; a wrong product is far off
        top2 = a.topk(2, dim=-1).values
        sure = top2[:, 0] - top2[:, 1] > 2 * diff
        assert torch.equal(a.argmax(-1)[sure], b.argmax(-1)[sure])
        clear += int(sure.sum())
    assert clear > 0  # the check above compared some tokens, not none
