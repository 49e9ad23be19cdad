"""Decode attention through our AVX2 kernel (engine/kernels/cpu_attention.cpp): one new token per sequence.

Why our own: a decode row's attention through SDPA has a fixed cost a call at any short context,
and a batch pays it once per sequence and layer plus two small copies each to store the new key and
value; at long context SDPA reads each KV head once per query head sharing it (GQA). Figures, with
CPU and date: docs/batching.md and docs/history.md; `python -m engine.bench bandwidth` with and
without `LATENCY_LAB_ATTENTION=off` shows its share on the machine at hand. The kernel stores
every decode sequence's new key and value and attends them all in one call a layer, streaming each
KV head once for its query heads, with keys cut into chunks that depend only on the sequence's own
length: a sequence gets the same bits alone and in any batch (batching's exactness needs that).

Where: fp32 caches on CPU, where our kernels build (engine/kernels/cpu_gemm.py: AVX2, a compiler, ninja),
after a check against SDPA; else SDPA serves, as before (the execution plan decides, engine/runtime/plan.py).
A cache kept at another precision (the kv_cache_dtype toggle, engine/model/kv_cache.py: fp16, bf16, int8 with
a scale per head per position) is read by the same kernel (`decode_attention_kv`), each row widened to fp32
as it streams in, so a step reads the cache's own bytes, a quarter of fp32's for int8; checked against SDPA
over the dequantized cache. Where it does not serve, such a cache is dequantized for SDPA each layer.
Its switch (engine/kernels/switches.py, `LATENCY_LAB_ATTENTION=off`) forces SDPA.
Rows of a prefill or a speculative verify keep SDPA (they are GEMM-shaped: its flash kernel suits).
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from engine.core.errors import first_line
from engine.kernels import cpu_gemm, switches

NAME = "latency_lab AVX2 decode attention (engine/kernels/cpu_attention.py)"
SDPA = "torch scaled_dot_product_attention"
PLAN_NAME = "ours-cpu"  # the execution plan's name for it (engine/runtime/plan.py)
PLAN_NAME_KV = "ours-cpu-kv"  # the same kernel over an fp16, bf16 or int8 cache (decode_attention_kv)
NAME_KV = "latency_lab AVX2 decode attention reading fp16/bf16/int8 caches (engine/kernels/cpu_attention.py)"


def unavailable_reason() -> str | None:
    """Why decode rows do not use our kernel here (None: they do)."""
    reason = switches.off_reason("attention") or cpu_gemm.built_reason()
    return reason if reason is not None else _checked()


MAX_GROUP, MAX_HEAD_DIM = 8, 256  # the kernel's kMaxGroup and kMaxDim (cpu_attention.cpp checks them too)


def shape_reason(heads: int, kv_heads: int, head_dim: int) -> str | None:
    """Why a model of these attention shapes cannot use our kernel (None: it can)."""
    if head_dim % 8 or head_dim > MAX_HEAD_DIM or heads % kv_heads or heads // kv_heads > MAX_GROUP:
        return (f"our kernel takes head sizes divisible by 8 up to {MAX_HEAD_DIM} and up to {MAX_GROUP} query "
                "heads per KV head")
    return None


def decode_attention(q, k_new, v_new, caches, rows, positions, layer: int, scale: float) -> torch.Tensor:
    """Store k_new / v_new row rows[b] at position positions[b] of layer `layer` of caches[b], and
    attend q's row rows[b] over positions [0, positions[b]] of it, for every b. q: [R, H, D];
    k_new, v_new: [R, KV, D] (views are fine: D must be contiguous). Returns [B, H, D] fp32."""
    return torch.ops.latency_lab_gemv.decode_attention(
        _last_contiguous(q), _last_contiguous(k_new), _last_contiguous(v_new), [c.k for c in caches],
        [c.v for c in caches], list(rows), list(positions), layer, float(scale))


def decode_attention_heads(q, k, v, caches, rows, positions, layer: int, scale: float) -> torch.Tensor:
    """`decode_attention` for q, k, v as the model's blocks hold them ([1, heads, R, D]: fast_llama.roped_heads)."""
    return decode_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), caches, rows,
                            positions, layer, scale)


def decode_attention_kv(q, k, v, caches, rows, positions, layer: int, scale: float) -> torch.Tensor:
    """`decode_attention_heads` over caches kept at another precision (KVCache.kind fp16, bf16 or int8, one
    kind per call): the new key and value stored as the cache keeps them (int8: quantized by kv_cache.py's
    rule), every row read back widened to fp32. Returns [B, H, D] fp32."""
    int8 = caches[0].kind == "int8"
    return torch.ops.latency_lab_gemv.decode_attention_kv(
        _last_contiguous(q[0].transpose(0, 1)), _last_contiguous(k[0].transpose(0, 1)),
        _last_contiguous(v[0].transpose(0, 1)), [c.k for c in caches], [c.v for c in caches],
        [c.k_scale for c in caches] if int8 else [], [c.v_scale for c in caches] if int8 else [],
        list(rows), list(positions), layer, float(scale))


def kv_unavailable_reason() -> str | None:
    """Why caches at another precision are not read by our kernel here (None: they are)."""
    reason = switches.off_reason("attention") or cpu_gemm.built_reason()
    return reason if reason is not None else _checked_kv()


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@functools.lru_cache(maxsize=1)
def _checked() -> str | None:
    """Our kernel against SDPA on a batch of caches: lengths inside one chunk, on its boundaries and
    across several, grouped query heads, rows out of order. None when it agrees."""
    try:
        gen = torch.Generator().manual_seed(0)
        layers, H, KV, D = 2, 6, 2, 64
        lengths = [1, 7, 256, 257, 700]
        caches = []
        for n in lengths:
            shape = (layers, 1, KV, n + 3, D)  # a KV cache's buffers (engine/model/kv_cache.py)
            caches.append(types.SimpleNamespace(k=torch.randn(shape, generator=gen), v=torch.randn(shape, generator=gen)))
        B = len(lengths)
        q, k, v = (torch.randn(B, h, D, generator=gen) for h in (H, KV, KV))
        rows = list(reversed(range(B)))
        got = decode_attention(q, k, v, caches, rows, [n - 1 for n in lengths], 1, D ** -0.5)
        for b, (c, n) in enumerate(zip(caches, lengths)):
            r = rows[b]
            if not (torch.equal(c.k[1, 0, :, n - 1], k[r]) and torch.equal(c.v[1, 0, :, n - 1], v[r])):
                return "decode attention kernel did not store the new key and value where asked"
            wrong = _against_sdpa(got[b], q[r][None, :, None], c.k[1, :, :, :n], c.v[1, :, :, :n], 1e-5, "")
            if wrong:
                return wrong
    except Exception as exc:  # noqa: BLE001 - a broken kernel must not serve; SDPA does
        return f"decode attention kernel failed its check: {type(exc).__name__}: {first_line(exc)}"
    return None


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (int8 values, fp32 scales [...]): symmetric per head per position, scale =
    max|x| / 127, q = round-half-even(x / scale), 0 where the head's values are all 0. The one rule: the
    KV cache (engine/model/kv_cache.py) stores a prompt's rows with it, the kernel's store_row a decode row's."""
    x = x.float()
    scale = x.abs().amax(-1) / 127.0
    q = torch.where(scale[..., None] > 0, torch.round(x / scale[..., None]), torch.zeros((), device=x.device))
    return q.clamp_(-127, 127).to(torch.int8), scale


STORAGE = {"fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


@functools.lru_cache(maxsize=1)
def _checked_kv() -> str | None:
    """decode_attention_kv against SDPA over the same caches widened to fp32, for each precision: lengths
    inside one chunk and across several, grouped query heads; the stored row as quantize_int8 (or .to) makes it."""
    try:
        gen = torch.Generator().manual_seed(0)
        layers, H, KV, D = 2, 6, 2, 64
        for kind, dtype in STORAGE.items():
            lengths = [1, 7, 300]
            caches = []
            for n in lengths:
                shape = (layers, 1, KV, n + 3, D)
                c = types.SimpleNamespace(kind=kind, k_scale=None, v_scale=None)
                if kind == "int8":
                    c.k, c.k_scale = quantize_int8(torch.randn(shape, generator=gen))
                    c.v, c.v_scale = quantize_int8(torch.randn(shape, generator=gen))
                else:
                    c.k, c.v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
                caches.append(c)
            B = len(lengths)
            q, k, v = (torch.randn(1, h, B, D, generator=gen) for h in (H, KV, KV))
            got = decode_attention_kv(q, k, v, caches, range(B), [n - 1 for n in lengths], 1, D ** -0.5)
            for b, (c, n) in enumerate(zip(caches, lengths)):
                kk, vv = c.k[1, :, :, :n].float(), c.v[1, :, :, :n].float()
                if kind == "int8":
                    kk, vv = kk * c.k_scale[1, :, :, :n, None], vv * c.v_scale[1, :, :, :n, None]
                    want_k, want_v = quantize_int8(k[0, :, b]), quantize_int8(v[0, :, b])
                    stored = (torch.equal(c.k[1, 0, :, n - 1], want_k[0]) and torch.equal(c.k_scale[1, 0, :, n - 1], want_k[1])
                              and torch.equal(c.v[1, 0, :, n - 1], want_v[0]) and torch.equal(c.v_scale[1, 0, :, n - 1], want_v[1]))
                else:
                    stored = (torch.equal(c.k[1, 0, :, n - 1], k[0, :, b].to(dtype))
                              and torch.equal(c.v[1, 0, :, n - 1], v[0, :, b].to(dtype)))
                if not stored:
                    return f"decode attention kernel ({kind} cache) did not store the new key and value by the cache's rule"
                wrong = _against_sdpa(got[b], q[:, :, b : b + 1], kk, vv, 1e-4, f" ({kind} cache)")
                if wrong:
                    return wrong
    except Exception as exc:  # noqa: BLE001 - a broken kernel must not serve; SDPA does
        return f"decode attention kernel over fp16/bf16/int8 caches failed its check: {type(exc).__name__}: {first_line(exc)}"
    return None


def _against_sdpa(got, q, keys, values, bound: float, what: str) -> str | None:
    """Why one row's kernel output `got` [H, D] is not SDPA's over the same fp32 keys and values (within
    `bound`, scale head_dim ** -0.5; `what` names the cache in the message), or None: both checks' tail."""
    n, D = keys.shape[-2], keys.shape[-1]
    want = F.scaled_dot_product_attention(q, keys, values, scale=D ** -0.5, enable_gqa=True)[0, :, 0]
    err = float((got - want).abs().max())
    if not err < bound:
        return f"decode attention kernel{what}: error {err:.2g} against SDPA at {n} keys"
    return None
