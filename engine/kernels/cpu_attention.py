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
            want = F.scaled_dot_product_attention(q[r][None, :, None], c.k[1, :, :, :n], c.v[1, :, :, :n],
                                                  scale=D ** -0.5, enable_gqa=True)[0, :, 0]
            err = float((got[b] - want).abs().max())
            if not err < 1e-5:
                return f"decode attention kernel: error {err:.2g} against SDPA at {n} keys"
    except Exception as exc:  # noqa: BLE001 - a broken kernel must not serve; SDPA does
        return f"decode attention kernel failed its check: {type(exc).__name__}: {first_line(exc)}"
    return None
