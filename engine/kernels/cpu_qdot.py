"""Integer dot-product kernels (engine/kernels/cpu_qdot.cpp): int8 and 4-bit weights times
activations quantized to int8 per block of 32, on the fly.

What they compute (the `w8a` variants, engine/quant/w8a.py): each row of x is cut into blocks of 32
inputs; a block gets the scale s = max|x| / 127 and the values round(x / s) in -127..127 (llama.cpp's
Q8_0; ONNX Runtime's MatMulNBits at accuracy level 4). The weights' integers meet them in exact
integer dot products, and float multiply-adds apply the scales, a block at a time for 16 channels:
  int8 weights (one scale per output channel):  y = scale[n] * sum_g s[g] * (w . xq)_g
  4-bit weights (scale and offset per 32 inputs): y = sum_g scale[n,g] s[g] (q . xq)_g + offset[n,g] * sum_g(x)
(the offset term takes the fp32 sums of x). So they change the bits of the weight-only variants,
whose activations stay fp32: the variants that use them say so by their name.

The layout (cpu_qdot.h; `quantize_int8` and `pack_int4` here): the weights in groups of 16 output
channels, a channel a lane, as the fp32 panels (cpu_gemm.fp32_panels), block after block: per block,
the pieces of the 16 channels' 4 weight bytes side by side (int8 8 pieces, 4-bit 4), the 4-bit
weights' 16 fp16 scales and 16 fp16 offsets after them. One broadcast activation dword meets 16
channels in one multiply-accumulate, a block's scales apply in one FMA a row, nothing is summed across
lanes, and a group is read in address order, one stream. The layout before (a channel's row, 8 blocks
of it in a vector's lanes, summed across lanes at the end; the int8 weights' and the quantized
activations' interleaved layout, which the activations keep) spent ~30 cycles of the vector ports a
576-input 4-bit row here: the kernel ran at about the memory's speed and so could not hide it
(docs/streams-2026-12-06.md: the measurements, and the groups' figures).

Why: widening every weight to fp32 (cpu_gemm.cpp's int8 kernel) or int16 (its 4-bit one) made
those kernels bound by arithmetic, not by memory; integer dot products do 32 products in one or two
instructions (`python -m engine.bench gemv` prints both at each row count).

The forms, best first (`ISAS`); the execution plan (engine/runtime/plan.py) picks the best one the
detected capabilities (engine/platform/capabilities.py) allow (`best_form`), confirmed by cpuid in the kernel itself (an emulator may show the host's flags in /proc/cpuinfo):
- `amx-int8`: AMX tiles (cpu_qdot_amx.cpp: tdpbssd, 16 rows x 16 channels x one block a multiply) for
  every 16 rows of a product, the 512-bit VNNI row kernels for the rows left over (a decode step's
  one): Sapphire Rapids and later Xeons, where Linux grants the tile state. A long prompt's products
  run ~2x the VNNI form's speed there (`python -m engine.bench gemv`; docs/quantization-amx-2026-12-06.md);
- `avx512-vnni`: vpdpbusd, EVEX on 512-bit vectors, two steps of a chunk a load (AVX-512 VNNI + VL +
  BW: Ice Lake and later Xeons, Zen 4/5);
- `avx512-vnni-256`: the same on 256-bit vectors: the fallback within that class. Intel's AVX-512
  cores run a 512-bit op natively, Zen 4 as two 256-bit halves, so there the two are level
  (docs/quantization.md has the figures: `python -m engine.bench gemv` times every form);
- `avx-vnni`: the same instruction VEX-encoded (Alder Lake and later client cores, Zen 5);
- `avx2`: vpmaddubsw + vpmaddwd (every x86-64 CPU torch dispatches AVX2 on).
The integer sums are exact and the float operations the same sequence in every form, so all forms
give the same bits (the check below holds them to it, at row counts inside and past a 16-row tile).
Where none of these runs (no AVX2, no compiler, a switch off, a failed
check), `reference` serves: the same arithmetic in torch ops (the integer sums exact in fp32: every
partial sum stays below 2^24), only the float sums' order differs.
"""

from __future__ import annotations

import functools

import torch

from engine.core.errors import first_line
from engine.kernels import cpu_gemm
from engine.platform import capabilities

BLOCK = 32  # inputs per activation scale (and per 4-bit weight scale)
_VNNI512 = ("avx2", "fma", "avx512_vnni", "avx512vl", "avx512bw")
# name -> (the kernel's code for it (cpu_qdot.cpp `Isa`), capabilities flags it needs, its instructions)
ISAS = {
    # its rows past the tiles run the 512-bit form: that form's flags and AMX's
    "amx-int8": (16, (*_VNNI512, "amx_tile", "amx_int8"),
                 "AMX-INT8 tiles (tdpbssd) for each 16 rows, vpdpbusd (AVX-512 VNNI, 512-bit) for the rest"),
    "avx512-vnni": (2, _VNNI512, "vpdpbusd (AVX-512 VNNI, 512-bit)"),
    "avx512-vnni-256": (8, _VNNI512, "vpdpbusd (AVX-512 VNNI, 256-bit)"),
    "avx-vnni": (4, ("avx2", "fma", "avx_vnni"), "vpdpbusd (AVX-VNNI)"),
    "avx2": (1, ("avx2", "fma"), "vpmaddubsw + vpmaddwd (AVX2)"),
}
REFERENCE = "torch reference (int8 activations, exact integer sums in fp32)"
# Added to a form's code (cpu_qdot.cpp kHardwareStream): the row kernels read their weights without asking
# for them 4 KB ahead (cpu_stream.h), the hardware's prefetchers alone. The plan's rule says where
# (engine/runtime/plan.py w8a_hardware_stream); the same bits either way (a prefetch only moves data between caches).
HARDWARE_STREAM = 32
# (vendor_id, cpu family, an ISA flag, the name, the weight kinds: 1 int8, 2 4-bit) of the CPUs whose row
# kernels of those kinds run without it. Zen 4 (family 25 with AVX-512; Zen 3 has none): its 4-bit step ran
# faster without, its int8 step as fast or faster with it, in one process taking turns
# (docs/quantization-w8a-2026-12-07.md: `python -m engine.bench quant_steps --prefetch`). On an Intel Xeon the
# prefetch made the 4-bit step far faster (docs/streams-2026-12-06.md).
HARDWARE_STREAM_CPUS = (("AuthenticAMD", 25, "avx512f", "AMD Zen 4", (2,)),)
KIND_NAMES = {1: "int8", 2: "4-bit"}  # the w8a layers' KIND (engine/quant/w8a.py; cpu_layers.cpp's kinds)


def code(form: str, prefetch: bool = True) -> int:
    """What the kernels take for `form` (an ISAS name), with or without our prefetch of the weights."""
    return ISAS[form][0] | (0 if prefetch else HARDWARE_STREAM)


# --- the weights' groups (cpu_qdot.h): 16 output channels side by side, block after block
LANES = 16  # output channels a group (cpu_qdot.h kLanes)


def _spans(n: int) -> list[tuple[int, int, int]]:
    """N channels' groups as (first, end, channels a group): the whole groups, then a last one of r < 16."""
    whole = n // LANES * LANES
    return [span for span in ((0, whole, LANES), (whole, n, n - whole)) if span[1] > span[0]]


def _side_by_side(t: torch.Tensor, c0: int, c1: int, r: int) -> torch.Tensor:
    """Channels [c0, c1) of t [N, G, P, W] (per block, P pieces of W bytes) in groups of r: [groups, G,
    P * r * W], each block's piece p of the r channels side by side."""
    _, g, p, w = t.shape
    return t[c0:c1].reshape(-1, r, g, p, w).permute(0, 2, 3, 1, 4).reshape(-1, g, p * r * w)


def _apart(rec: torch.Tensor, r: int, p: int, w: int) -> torch.Tensor:
    """_side_by_side's inverse: [groups, G, P * r * W] -> [groups * r, G, P, W]."""
    k, g, _ = rec.shape
    return rec.reshape(k, g, p, r, w).permute(0, 3, 1, 2, 4).reshape(k * r, g, p, w)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8wo's quantization (cpu_gemm.quantize_int8: symmetric, a scale per output channel), the weights
    in the integer kernels' groups ([N, K] int8: per block, 8 pieces of the 16 channels' 4 bytes)."""
    q, scale = cpu_gemm.quantize_int8(w)
    n, k = q.shape
    blocks = q.view(n, k // BLOCK, 8, 4)
    return torch.cat([_side_by_side(blocks, c0, c1, r).reshape(-1) for c0, c1, r in _spans(n)]).view(n, k), scale


def unpack_int8(w: torch.Tensor) -> torch.Tensor:
    """quantize_int8's groups back as int8 [N, K] in block order."""
    n, k = w.shape
    flat, g = w.reshape(-1), k // BLOCK
    return torch.cat([_apart(flat[c0 * k:c1 * k].view(-1, g, 32 * r), r, 8, 4).reshape(c1 - c0, k)
                      for c0, c1, r in _spans(n)])


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor | None:
    """cpu_gemm.pack_int4's 4-bit blocks (q in 0..15, w = (q - 8) * scale + zero; fp16 scale and offset
    per block) as the integer kernels' groups of 16 output channels ([N, K / 2 + K / 8] bytes, cpu_qdot.h):
    per block, 4 pieces of each channel's 4 weight bytes side by side, the 16 fp16 scales, the 16 fp16
    offsets. None where fp16 cannot hold the scales."""
    layout = cpu_gemm.pack_int4(q, scale, zero)
    if layout is None:
        return None
    packed, s16, o16 = layout
    n, half = packed.shape
    g = half // 16
    w, s, o = packed.view(n, g, 4, 4), s16.view(torch.uint8).view(n, g, 1, 2), o16.view(torch.uint8).view(n, g, 1, 2)
    parts = [torch.cat([_side_by_side(t, c0, c1, r) for t in (w, s, o)], dim=2).reshape(-1) for c0, c1, r in _spans(n)]
    return torch.cat(parts).view(n, half + 4 * g)


def int4_parts(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack_int4's groups as (weight bytes [N, K / 2] in block order, as cpu_gemm.pack_int4 makes them,
    fp16 scale, fp16 offset [N, K / 32]): copies."""
    n, row = rows.shape
    g = row // 20
    flat = rows.reshape(-1)
    ws, ss, os_ = [], [], []
    for c0, c1, r in _spans(n):
        rec = flat[c0 * row:c1 * row].view(-1, g, 20 * r)
        ws.append(_apart(rec[..., :16 * r], r, 4, 4).reshape(c1 - c0, 16 * g))
        ss.append(_apart(rec[..., 16 * r:18 * r], r, 1, 2).reshape(c1 - c0, 2 * g).view(torch.float16))
        os_.append(_apart(rec[..., 18 * r:], r, 1, 2).reshape(c1 - c0, 2 * g).view(torch.float16))
    return torch.cat(ws), torch.cat(ss), torch.cat(os_)


def cpu_isas() -> frozenset[str]:
    """The forms this CPU executes, by cpuid (empty where our extension is not built here)."""
    if cpu_gemm.built_reason() is not None:
        return frozenset()
    mask = torch.ops.latency_lab_gemv.qdot_isas()
    return frozenset(name for name, (code, _, _) in ISAS.items() if mask & code)


def best_form(caps) -> str | None:
    """The best form (ISAS order) that the capabilities `caps` list the flags of, that cpuid confirms and
    that passed its check; None: the torch reference serves. A fact the execution plan reads
    (engine/runtime/plan.py `w8a_form`: the one place the form is chosen); tests pass forced `caps`."""
    if unavailable_reason() is not None:
        return None
    have, runs = set(caps.isa), cpu_isas()
    for name, (_, flags, _) in ISAS.items():
        if name in runs and set(flags) <= have and _checked().get(name) is None:
            return name
    return None


def unavailable_reason() -> str | None:
    """Why none of our integer kernels runs here (None: at least one does)."""
    reason = cpu_gemm.unavailable_reason()
    if reason:
        return reason
    failed = _checked()
    if failed and all(failed.values()):
        return "; ".join(f"{k}: {v}" for k, v in failed.items())
    if not failed:
        return "this CPU runs none of their forms (" + ", ".join(ISAS) + ")"
    return None


def describe(form: str | None) -> str:
    """What serves a w8a product in `form` (the plan's; None: the torch reference), for engine info."""
    if form is None:
        return f"{REFERENCE}; our kernels not used: {unavailable_reason() or 'the capabilities allow none'}"
    return f"latency_lab integer kernels, {form}: {ISAS[form][2]} (engine/kernels/cpu_qdot.py)"


def int8_w8a(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, isa: str | None,
             prefetch: bool = True) -> torch.Tensor:
    """x [M, K] fp32 @ (w [N, K] int8 * scale [N] fp32).T with x quantized per block: [M, N] fp32, in form
    `isa` (None: the torch reference), with our prefetch of the weights or without (`code`)."""
    if isa is None:
        return int8_reference(x, w, scale)
    return torch.ops.latency_lab_gemv.qdot_int8(x, w, scale, code(isa, prefetch))


def int4_w8a(x: torch.Tensor, rows: torch.Tensor, isa: str | None, prefetch: bool = True) -> torch.Tensor:
    """x [M, K] fp32 @ the 4-bit weights of pack_int4's groups (fp16 scale and offset per block).T, in
    form `isa` (None: the torch reference), with our prefetch of the weights or without (`code`)."""
    if isa is None:
        return int4_reference(x, rows)
    return torch.ops.latency_lab_gemv.qdot_int4(x, rows, code(isa, prefetch))


def normed_w8a(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weights: list[torch.Tensor], kind: int,
               bias: torch.Tensor | None, isa: str, prefetch: bool = True) -> torch.Tensor:
    """rms_norm(x [M, K] fp32, norm_weight, eps) times a w8a layer's weights (its WEIGHTS; `kind` its KIND: 1
    int8 [w, scale], 2 4-bit [rows]), plus bias, in form `isa` (`code`): the norm folded into the activations'
    quantizer (cpu_fused.cpp qdot_project), so the normed rows are never written out; the same bits as
    torch's rms_norm, then int8_w8a / int4_w8a."""
    return torch.ops.latency_lab_gemv.qdot_project(x, norm_weight, eps, None, weights, kind, code(isa, prefetch),
                                                   bias, None)


def dequantized(w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The weights in fp32 [N, K] (int8 with fp32 scales per channel, or pack_int4's 4-bit groups, scale
    None; as quantize_int8 and pack_int4 make them): a long prefill multiplies them by fp32 activations in the fp32
    GEMM (engine/quant/w8a.py `prefill`), where that beats the integer kernels."""
    if cpu_gemm.built_reason() is None:
        return torch.ops.latency_lab_gemv.qdot_dequantize(w, scale)
    if scale is not None:
        return unpack_int8(w).float() * scale.float()[:, None]
    packed, s16, o16 = int4_parts(w)
    return _nibbles(packed).float() * s16.float().repeat_interleave(BLOCK, 1) + o16.float().repeat_interleave(BLOCK, 1)


# --- the reference: the same arithmetic in torch (the fallback, and what the kernels are checked against)
def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 -> (xq int8 [M, K], scale [M, K/32], fp32 sum [M, K/32]): the kernel's own rounding
    (round half to even of x * (1 / s)), so xq matches it bit for bit."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // BLOCK, BLOCK)
    s = blocks.abs().amax(dim=2) / 127.0
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    xq = torch.round(blocks * inv[..., None]).to(torch.int8).reshape(m, k)
    return xq, s, blocks.sum(dim=2)


def _block_dots(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """[M, N, G] exact integer dot products per block (fp32 holds every partial sum exactly)."""
    m, k = xq.shape
    n = wq.shape[0]
    return torch.einsum("mgk,ngk->mng", xq.float().reshape(m, k // BLOCK, BLOCK),
                        wq.float().reshape(n, k // BLOCK, BLOCK))


def _chunks(n: int, m: int, g: int):
    step = max(1, (1 << 24) // max(1, m * g))  # at most ~16M elements of block sums at once
    return range(0, n, step), step


def int8_reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x times quantize_int8's groups of weights, as the kernels compute it (sums in another order)."""
    w = unpack_int8(w)
    xq, xs, _ = quantize_reference(x)
    starts, step = _chunks(w.shape[0], x.shape[0], xs.shape[1])
    parts = [(_block_dots(xq, w[i:i + step]) * xs[:, None, :]).sum(dim=2) * scale[i:i + step].float()
             for i in starts]
    return torch.cat(parts, dim=1)


def unpack_int4(rows: torch.Tensor) -> torch.Tensor:
    """q in 0..15 [N, K] from pack_int4's groups."""
    return _nibbles(int4_parts(rows)[0])


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """q in 0..15 [N, K] from int4_parts' weight bytes (byte j of a block: q[j] low, q[j + 16] high)."""
    n, half = packed.shape
    b = packed.reshape(n, half // 16, 16)
    return torch.cat([b & 0x0F, b >> 4], dim=2).reshape(n, half * 2)


def int4_reference(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    xq, xs, xsum = quantize_reference(x)
    packed, scale, offset = int4_parts(rows)  # one pass over the rows a call: the fallback's hot path
    q = _nibbles(packed)
    starts, step = _chunks(q.shape[0], x.shape[0], xs.shape[1])
    parts = [(_block_dots(xq, q[i:i + step]) * (scale[i:i + step].float()[None] * xs[:, None, :])).sum(dim=2)
             + xsum @ offset[i:i + step].float().T for i in starts]
    return torch.cat(parts, dim=1)


@functools.lru_cache(maxsize=1)
def _checked() -> dict[str, str | None]:
    """Each form this CPU executes against the reference, and all of them against each other bit for
    bit, at row counts inside and across the 4-row blocks: {form: None (passed) or why it failed}."""
    if cpu_gemm.built_reason() is not None:
        return {}
    gen = torch.Generator().manual_seed(0)
    n, k = 72, 320  # past the 64-channel tiles, a last group of 8 channels; 10 blocks: a chunk of 8 and a partial one
    w = torch.randn(n, k, generator=gen)
    q8, s8 = quantize_int8(w)
    q4 = torch.randint(0, 16, (n, k), generator=gen)
    packed = pack_int4(q4, torch.rand(n, k // BLOCK, generator=gen) * 0.1, torch.randn(n, k // BLOCK, generator=gen) * 0.1)
    xs = [torch.randn(m, k, generator=gen) * 3 for m in (1, 2, 3, 4, 5, 9, 16, 35)]  # AMX: 16-row tiles and rows past them
    xs[0][0, :BLOCK] = 0  # an all-zero block: scale 0
    results, out = {}, {}
    for name in ISAS:
        if name not in cpu_isas():
            continue
        try:
            got = []
            for x in xs:
                xq, _, _ = torch.ops.latency_lab_gemv.qdot_quantize(x)
                if not torch.equal(xq, quantize_reference(x)[0]):
                    raise RuntimeError("activation quantization differs from the reference")
                a = int8_w8a(x, q8, s8, name)
                b = int4_w8a(x, packed, name)
                _close(a, int8_reference(x, q8, s8), "int8")
                _close(b, int4_reference(x, packed), "4-bit")
                got.append((a, b))
            results[name], out[name] = None, got
        except Exception as exc:  # a wrong result or a missing instruction: this form does not serve
            results[name] = f"{type(exc).__name__}: {first_line(exc)}"
    forms = list(out)
    for name in forms[1:]:
        if not all(torch.equal(a, b) for pa, pb in zip(out[forms[0]], out[name]) for a, b in zip(pa, pb)):
            results[name] = f"differs in its bits from {forms[0]}"
    return results


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = float((got - want).abs().max() / want.abs().max())
    if not err < 1e-5:  # the same integers; only the float sums' order differs
        raise RuntimeError(f"{what} kernel: relative error {err:.2g} at {got.shape[0]} rows")
