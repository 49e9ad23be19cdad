"""One decode step for B sequences through one forward of `FastLlama` (continuous batching).

Every sequence brings its last token and its own `KVCache` (its own length). The projections
and the MLP run as one matmul over B rows — a decode step is memory-bound, so the weights are
read once for all B — and attention runs per sequence, one SDPA call over its own cache: no
padding, no mask, and exactly the call a sequence alone would make.

Exactness. A batched row must equal the row the same sequence would get alone, bit for bit, or
greedy output would depend on who else is running. MKL's fp32 GEMM is not batch-invariant here
(AMD EPYC Zen 3, torch 2.13): a row computed with M=1 differs from M=2..3 and from M>=4 (by
~1e-6). oneDNN's fp32 matmul over a pre-packed weight gave the same row for every M from 1 to 16
(checked per row), so batched decoding routes every fp32 Linear through a packed copy, also at
B=1: a request alone on a batching engine and the same request in a batch of 8 get identical
logits. That copy costs the fp32 weights' size again in memory (`packed_mb` in engine info); a
one-row step through it cost the same as ATen's GEMV here (100 vs 103 ms for all 211
projections of SmolLM2, one thread, machine busy), eight rows 1.8x one row. Other dtypes and
quantized modules take their usual path (`fast_llama.project`); there the promise is not made.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .fast_llama import FastLlama, _gemm_backend, _rope, project
from .kv_cache import KVCache

_PACKED_FP32 = WeakIdKeyDictionary()  # weight tensor -> its oneDNN-packed copy (or False: cannot pack)


def supports(model) -> bool:
    """Whether `model` can decode a batch in one forward (our Llama forward on CPU or GPU)."""
    return isinstance(model, FastLlama)


def _packed_fp32(linear: nn.Module):
    if type(linear) is not nn.Linear or linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu" \
            or not torch.backends.mkldnn.is_available():
        return None
    w = linear.weight
    p = _PACKED_FP32.get(w)
    if p is None:
        try:
            p = torch.ops.mkldnn._reorder_linear_weight(w.detach())
        except RuntimeError:
            p = False
        _PACKED_FP32[w] = p
    return p if p is not False else None


def pack(model) -> None:
    """Pack every fp32 Linear now, not inside the first batched step."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _packed_fp32(module)


def packed_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in _PACKED_FP32.values() if p is not False)


def _linear(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    packed = _packed_fp32(linear)
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")
    with _gemm_backend(rows=x.shape[0] * x.shape[1]):
        return project(linear, x)


@torch.inference_mode()
def forward_batch(model: FastLlama, tokens: list[int], caches: list[KVCache]) -> torch.Tensor:
    """Feed token b at position caches[b].length of sequence b, for every b; append its KV.
    Returns float32 logits [B, vocab]."""
    B = len(tokens)
    starts = [c.length for c in caches]
    for c, s in zip(caches, starts):
        if s + 1 > model.max_context:
            raise ValueError(f"position {s + 1} is beyond the context window ({model.max_context})")
        c.ensure_capacity(s + 1)
    H, KV, D = model.n_heads, model.n_kv_heads, model.head_dim
    device = model.device
    pos = torch.tensor(starts, dtype=torch.long, device=device)
    cos, sin = model.cos[pos][:, None, None, :], model.sin[pos][:, None, None, :]  # [B, 1, 1, D]
    x = model.embed(torch.tensor(tokens, dtype=torch.long, device=device)[:, None])  # [B, 1, hidden]
    for i, blk in enumerate(model.blocks):
        q, k, v = _linear(blk.qkv, blk.attn_norm(x)).split([blk.q_size, blk.kv_size, blk.kv_size], dim=-1)
        q = _rope(q.view(B, 1, H, D).transpose(1, 2), cos, sin)  # [B, H, 1, D]
        k = _rope(k.view(B, 1, KV, D).transpose(1, 2), cos, sin)
        v = v.view(B, 1, KV, D).transpose(1, 2)
        outs = []
        for b, (c, s) in enumerate(zip(caches, starts)):
            c.k[i, :, :, s : s + 1] = k[b : b + 1]
            c.v[i, :, :, s : s + 1] = v[b : b + 1]
            outs.append(F.scaled_dot_product_attention(
                q[b : b + 1], c.k[i, :, :, : s + 1], c.v[i, :, :, : s + 1], scale=blk.scaling, enable_gqa=H != KV))
        attn = torch.cat(outs) if B > 1 else outs[0]  # [B, H, 1, D]
        x = x + _linear(blk.o, attn.transpose(1, 2).reshape(B, 1, H * D))
        gate, up = _linear(blk.gate_up, blk.mlp_norm(x)).chunk(2, dim=-1)
        x = x + _linear(blk.down, F.silu(gate) * up)
    for c, s in zip(caches, starts):
        c.length = s + 1
    return _linear(model.lm_head, model.norm(x))[:, 0].float()
