"""Our integer dot-product kernels (engine/kernels/cpu_qdot.py) and the w8a variants built on them:
every form this CPU runs equals the reference arithmetic and the other forms bit for bit, a row's
result does not depend on the rows beside it, the form is chosen from the capabilities with each
fallback reachable (forced here for the CPU classes this machine is not), and a w8a variant's greedy
output is the same alone and batched."""

from dataclasses import replace

import pytest
import torch
from torch import nn

from engine.core.errors import LoadError
from engine.kernels import catalogue, cpu_gemm, cpu_qdot
from engine.kernels.catalogue import Kernel
from engine.platform import capabilities
from engine.quant import w8a
from engine.quant.w8a import Int4W8ALinear, Int8W8ALinear
from engine.quant.weight_only import Int4WeightOnlyLinear
from engine.runtime import plan
from engine.runtime.runner import Batch, Runner
from engine.serving.variants import build, precheck

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
