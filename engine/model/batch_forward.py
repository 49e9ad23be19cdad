"""One forward of `FastLlama` for B sequences at once (continuous batching).

Every sequence brings its next tokens — one for a decode step, a prompt chunk for a prefill —
and its own `KVCache` (its own length). The projections and the MLP run as one matmul over all
their rows — a decode step is memory-bound, so the weights are read once for all — and attention
runs over each sequence's own cache: no padding, and exactly the computation a sequence alone
would get. Decode rows (one token) go through one call of our kernel a layer for all of them
(engine/kernels/cpu_attention.py: it also stores their keys and values); prompt rows take one SDPA call per
sequence with its own causal mask. A newcomer's prefill thus shares the forward of the
running batch's decode step instead of stalling it with a forward of its own.

Exactness. A batched row must equal the row the same sequence would get alone, bit for bit, or
greedy output would depend on who else is running. MKL's fp32 GEMM is not batch-invariant here
(AMD EPYC Zen 3, torch 2.13): a row computed with M=1 differs from M=2..3 and from M>=4 (by
~1e-6). Two kernels are: our fp32 kernel (engine/kernels/cpu_gemm.py: every output summed in one fixed
order at any row count), which serves every batched row where it builds (a sequence never brings
more than INTERLEAVE_CHUNK = OURS_ROWS rows), and oneDNN's fp32 matmul over a pre-packed weight
(the same row for every M from 1 to 300, checked per row), which serves where ours does not. So a
request alone on a batching engine and the same request in a batch of 8 get identical logits. Either
copy costs the fp32 weights' size again in memory (`packed_mb` in engine info). Other dtypes and
quantized modules take their usual path (`fast_llama.project`); there the promise is not made.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import cpu_attention, cpu_layers
from engine.kernels.cpu_gemm import ours, ours_serves, panels
from engine.model.fast_llama import (
    BATCH_ROWS,
    OURS_ROWS,
    FastLlama,
    _gemm_backend,
    packed_weight,
    project,
    roped_heads,
)
from engine.model.kv_cache import KVCache


def supports(model) -> bool:
    """Whether `model` can decode a batch in one forward (our Llama forward on CPU or GPU)."""
    return isinstance(model, FastLlama)


def pack(model) -> None:
    """Make the weight copies the batched forward reads now, not inside its first step: our fp32
    kernel's panels where it serves, else oneDNN's packed copy (a no-op once made)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            panels(module) if ours_serves(module) else packed_weight(module)


class _Rows:
    """Which kernel each row of a batched forward takes, by its own sequence's row count in it: a
    sequence bringing at most OURS_ROWS rows (every one the scheduler makes: a decode step, a prompt
    chunk) goes through our fp32 kernel where it serves (engine/kernels/cpu_gemm.py: 1.4x the packed copy's
    speed for a batch of 8 decode rows, on par from 64 rows on, Zen 4); a longer one through the packed
    copy. Both give a row the same bits whatever else shares the call, and a row's kernel depends only
    on its own sequence, never on who shares the forward: a sequence gets the same bits alone and in
    any batch."""

    def __init__(self, lengths: list[int], device):
        self.offsets = offsets = [sum(lengths[:b]) for b in range(len(lengths))]  # sequence b's first row
        small = [n <= OURS_ROWS for n in lengths]
        self.all_small, self.any_small = all(small), any(small)
        if self.any_small and not self.all_small:  # the row indices only a mixed forward splits by
            self.small, self.large = (torch.tensor([o + j for o, n, s in zip(offsets, lengths, small) if s == want
                                                    for j in range(n)], dtype=torch.long, device=device)
                                      for want in (True, False))

    def linear(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self.any_small or not ours_serves(linear):
            return _packed(linear, x)
        if self.all_small:
            return ours(linear, x)
        y = x.new_empty(*x.shape[:-1], linear.out_features)
        y[0, self.small] = ours(linear, x[0, self.small])
        y[0, self.large] = _packed(linear, x[0, self.large][None])[0]
        return y


def _packed(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Every fp32 row through the packed copy, one row too (the same bits at any batch size)."""
    with _gemm_backend(rows=x.shape[0] * x.shape[1]):
        return project(linear, x, BATCH_ROWS)


@torch.inference_mode()
def forward_batch(model: FastLlama, rows: list[list[int]], caches: list[KVCache]) -> torch.Tensor:
    """Feed sequence b its tokens `rows[b]` at positions [caches[b].length, + len(rows[b])) and
    append their KV, for every b, in one forward: a decode step brings one token, a prefill
    (chunk) several. Returns float32 logits [B, vocab] of each sequence's last token."""
    lengths = [len(r) for r in rows]
    starts = [c.length for c in caches]
    for c, s, n in zip(caches, starts, lengths):
        if s + n > model.max_context:
            raise ValueError(f"position {s + n} is beyond the context window ({model.max_context})")
        c.ensure_capacity(s + n)
    device = model.device
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)]).to(device)
    cos, sin = model.cos[pos], model.sin[pos]  # [R, D]: each row at its own sequence's position
    x = model.embed(torch.tensor([t for r in rows for t in r], dtype=torch.long, device=device)[None])  # [1, R, hidden]
    masks = [None if n == 1 or s == 0 else torch.ones(n, s + n, dtype=torch.bool, device=device).tril(diagonal=s)
             for s, n in zip(starts, lengths)]  # as FastLlama._blocks: new tokens see the prefix and each other
    kinds = _Rows(lengths, device)
    offsets = kinds.offsets
    # Decode rows (one token) of every sequence in one call of our kernel where it serves; prompt rows
    # per sequence through SDPA. A sequence alone makes the same choice (FastLlama._blocks): same bits.
    kernel = cpu_attention.serves(caches[0].k, model.n_heads)
    decode = [b for b, n in enumerate(lengths) if kernel and n == 1]
    others = [b for b, n in enumerate(lengths) if not (kernel and n == 1)]
    layers = cpu_layers.layer_weights(model) if kinds.all_small else None
    if layers is not None:  # the same loop in one C++ call: the same bits, far fewer lock hand-offs
        x = cpu_layers.run_layers(model, layers, x, cos, sin, caches, starts, lengths, offsets, decode, others, masks)
    else:
        x = _layers(model, x, cos, sin, caches, starts, lengths, kinds, decode, others, masks)
    for c, s, n in zip(caches, starts, lengths):
        c.length = s + n
    last = torch.tensor([o + n - 1 for o, n in zip(offsets, lengths)], device=device)
    head = model.lm_head  # one row per sequence, its last: through our kernel, as a lone decode step's
    h = model.norm(x[:, last])
    return (ours(head, h) if ours_serves(head) else _packed(head, h))[0].float()


def _layers(model, x, cos, sin, caches, starts, lengths, kinds: _Rows, decode, others, masks):
    """forward_batch's layer loop in Python (engine/kernels/cpu_layers.cpp is this loop in C++)."""
    H, KV, D = model.n_heads, model.n_kv_heads, model.head_dim
    R, _linear, offsets = x.shape[1], kinds.linear, kinds.offsets
    decode_rows = torch.tensor([offsets[b] for b in decode], device=x.device)
    for i, blk in enumerate(model.blocks):
        q, k, v = roped_heads(blk, _linear(blk.qkv, blk.attn_norm(x)), H, KV, D, cos, sin)  # [1, heads, R, D]
        if not others:  # decode only: rows are sequences, in order
            attn = cpu_attention.decode_attention_heads(q, k, v, caches, range(R), starts, i, blk.scaling)  # [R, H, D]
        else:
            attn = q.new_empty(R, H, D)
            if decode:
                attn[decode_rows] = cpu_attention.decode_attention_heads(
                    q, k, v, [caches[b] for b in decode], [offsets[b] for b in decode], [starts[b] for b in decode],
                    i, blk.scaling)
            for b in others:
                c, s, n, row = caches[b], starts[b], lengths[b], offsets[b]
                c.k[i, :, :, s : s + n] = k[:, :, row : row + n]
                c.v[i, :, :, s : s + n] = v[:, :, row : row + n]
                attn[row : row + n] = F.scaled_dot_product_attention(
                    q[:, :, row : row + n], c.k[i, :, :, : s + n], c.v[i, :, :, : s + n], attn_mask=masks[b],
                    is_causal=n > 1 and s == 0, scale=blk.scaling, enable_gqa=H != KV)[0].transpose(0, 1)
        attn = attn.reshape(1, R, H * D)
        x = x + _linear(blk.o, attn)
        gate, up = _linear(blk.gate_up, blk.mlp_norm(x)).chunk(2, dim=-1)
        x = x + _linear(blk.down, F.silu(gate) * up)
    return x
