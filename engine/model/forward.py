"""The one forward of our Llama-family model (`FastLlama`): B sequences, one sequence being a batch of one.

Every sequence brings its next tokens — one for a decode step, a prompt (chunk) or a speculative
verify's several — and its own `KVCache` (its own length). The projections and the MLP run as one
matmul over all rows where their kernel allows (a decode step is memory-bound: the weights are read
once for all); attention runs over each sequence's own cache: no padding, and exactly the
computation the sequence would get alone. Decode rows (one token) go through our attention kernel
in one call a layer for all of them (engine/kernels/cpu_attention.py, which also stores their keys
and values) where it serves; other rows take one SDPA call per sequence with its own causal mask.

Kernels: every projection asks engine/kernels/choose.py with ITS sequence's row count, never the
forward's total, so a sequence's kernels — and bits — do not depend on who shares the forward; a
kernel that is not row-invariant runs once per sequence (choose.per_sequence). So greedy fp32 output
is the same alone, batched, and through either worker.

Layer loop: `blocks` in Python is the reference; where every projection's rows go to our fp32
kernel and its switch is on, engine/kernels/cpu_layers.cpp runs the same loop in one C++ call
(tested bit-equal). The compiled decode step (engine/model/compiled_step.py) traces `blocks` too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import choose, cpu_attention, cpu_layers
from engine.kernels.choose import Kernel


@torch.inference_mode()
def forward(model, rows, caches, all_logits: bool = False) -> torch.Tensor:
    """Feed sequence b its tokens `rows[b]` (a list of ids or a 1-D tensor) at positions
    [caches[b].length, + len(rows[b])) and append their KV, for every b, in one forward. Returns
    float32 logits: [B, vocab], each sequence's last token; with all_logits every row's, [R, vocab]
    (one sequence: [T, vocab])."""
    lengths = [len(r) for r in rows]
    starts = [c.length for c in caches]
    for c, s, n in zip(caches, starts, lengths):
        if s + n > model.max_context:
            raise ValueError(f"position {s + n} is beyond the context window ({model.max_context})")
        c.ensure_capacity(s + n)
    device, B = model.device, len(rows)
    if all(isinstance(r, torch.Tensor) for r in rows):
        ids = (rows[0] if B == 1 else torch.cat(list(rows))).to(device=device, dtype=torch.long)
    else:
        ids = torch.tensor([int(t) for r in rows for t in r], dtype=torch.long, device=device)
    if B == 1:  # a slice: the same values as the gather below, without building positions
        cos, sin = model.cos[starts[0] : starts[0] + lengths[0]], model.sin[starts[0] : starts[0] + lengths[0]]
    else:
        pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)]).to(device)
        cos, sin = model.cos[pos], model.sin[pos]  # [R, D]: each row at its own sequence's position
    x = model.embed(ids[None])  # [1, R, hidden]
    masks = [None if n == 1 or s == 0 else torch.ones(n, s + n, dtype=torch.bool, device=device).tril(diagonal=s)
             for s, n in zip(starts, lengths)]  # new tokens see the cached prefix, and causally each other
    plan = choose.plan_of(model)
    offsets = [sum(lengths[:b]) for b in range(B)]  # sequence b's first row
    kernel = cpu_attention.serves(caches[0].k, model.n_heads)
    decode = [b for b, n in enumerate(lengths) if kernel and n == 1]  # rows through our attention kernel
    others = [b for b, n in enumerate(lengths) if not (kernel and n == 1)]  # through SDPA
    layers = cpu_layers.layer_weights(model) if _all_ours(model, lengths, plan) else None
    if layers is not None:  # the same loop in one C++ call: the same bits, far fewer interpreter hand-offs
        x = cpu_layers.run_layers(model, layers, x, cos, sin, caches, starts, lengths, offsets, decode, others, masks)
    else:
        attend = _attention(model, caches, starts, lengths, offsets, decode, others, masks)
        x = blocks(model, x, cos, sin, Projections(lengths, plan).linear, attend)
    for c, s, n in zip(caches, starts, lengths):
        c.length = s + n
    if all_logits:
        head_lengths = lengths
    else:
        head_lengths = [1] * B
        x = x[:, -1:] if B == 1 else x[:, torch.tensor([o + n - 1 for o, n in zip(offsets, lengths)], device=device)]
    return Projections(head_lengths, plan).linear(model.lm_head, model.norm(x))[0].float()


def _all_ours(model, lengths, plan) -> bool:
    """Whether every projection row of this forward goes to our fp32 kernel (the C++ loop's condition;
    cpu_layers.layer_weights checks the projections and the switch)."""
    return choose.choose(model.blocks[0].qkv, max(lengths), plan) is Kernel.OURS_FP32


def blocks(model, x, cos, sin, linear, attend) -> torch.Tensor:
    """The decoder blocks over hidden states x ([1, R, hidden]): `linear(module, x)` runs a projection,
    `attend(layer, block, q, k, v)` stores k, v and returns attention as [R, heads, head_dim]. The one
    loop of the eager forward and the compiled decode step, so they cannot drift."""
    R = x.shape[1]
    H, KV, D = model.n_heads, model.n_kv_heads, model.head_dim
    for i, blk in enumerate(model.blocks):
        q, k, v = roped_heads(blk, linear(blk.qkv, blk.attn_norm(x)), H, KV, D, cos, sin)  # [1, heads, R, D]
        x = x + linear(blk.o, attend(i, blk, q, k, v).reshape(1, R, H * D))
        gate, up = linear(blk.gate_up, blk.mlp_norm(x)).chunk(2, dim=-1)
        x = x + linear(blk.down, F.silu(gate) * up)
    return x


def _attention(model, caches, starts, lengths, offsets, decode, others, masks):
    """The eager forward's `attend`: decode rows through our kernel, the others through SDPA."""
    H, KV, D = model.n_heads, model.n_kv_heads, model.head_dim
    decode_rows = torch.tensor([offsets[b] for b in decode], device=model.device) if others and decode else None

    def attend(i, blk, q, k, v):
        if not others:  # decode only: rows are sequences, in order
            return cpu_attention.decode_attention_heads(q, k, v, caches, range(len(caches)), starts, i, blk.scaling)
        R = q.shape[2]
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
        return attn

    return attend


class Projections:
    """Runs a projection over a forward's rows, each sequence's part on the kernel `choose` names for
    ITS row count: one call for all rows where they share a kernel, one per group of sequences
    sharing one otherwise, one per sequence where the kernel is not row-invariant (choose.per_sequence)."""

    def __init__(self, lengths: list[int], plan: choose.Plan):
        self.lengths, self.plan = lengths, plan
        self.offsets = [sum(lengths[:b]) for b in range(len(lengths))]
        self.uniform = len(set(lengths)) == 1

    def linear(self, linear, x: torch.Tensor) -> torch.Tensor:
        lengths = self.lengths
        if self.uniform:  # every sequence the same row count: one kernel (the common case, decode rows)
            kernel = choose.choose(linear, lengths[0], self.plan)
            if len(lengths) == 1 or not choose.per_sequence(kernel, linear):
                return choose.run(kernel, linear, x)
        groups: dict[Kernel, list[int]] = {}
        for b, n in enumerate(lengths):
            groups.setdefault(choose.choose(linear, n, self.plan), []).append(b)
        y = x.new_empty(*x.shape[:-1], linear.out_features)
        for kernel, seqs in groups.items():
            parts = [seqs] if not choose.per_sequence(kernel, linear) else [[b] for b in seqs]
            for part in parts:
                idx = torch.tensor([self.offsets[b] + j for b in part for j in range(lengths[b])],
                                   dtype=torch.long, device=x.device)
                y[0, idx] = choose.run(kernel, linear, x[0, idx][None])[0]
        return y


def roped_heads(blk, qkv: torch.Tensor, H: int, KV: int, D: int, cos, sin):
    """q, k, v as [1, heads, T, D] from the fused q/k/v projection's output ([1, T, ...]), with
    rotary positions applied to q and k in one pass (they sit side by side in that output)."""
    T = qkv.shape[1]
    qk = _rope(qkv[..., : blk.q_size + blk.kv_size].view(1, T, H + KV, D).transpose(1, 2), cos, sin)
    return qk[:, :H], qk[:, H:], qkv[..., blk.q_size + blk.kv_size :].view(1, T, KV, D).transpose(1, 2)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
