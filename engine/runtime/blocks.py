"""The decoder blocks of our Llama-family model and how a projection runs over a forward's rows.

`blocks` is the one layer loop: the eager forward (engine/runtime/eager.py), the compiled decode step
(engine/runtime/compiled.py) and the static decode step that CUDA graphs capture
(engine/runtime/cuda_graph.py) all run it, each with its own `linear` and `attend`, so they cannot drift.
`Projections` runs a projection with the kernel the execution plan (engine/runtime/plan.py) names
for each sequence's rows: a table lookup per projection, no decision.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import catalogue
from engine.kernels.catalogue import Kernel


def blocks(model, x, cos, sin, linear, attend) -> torch.Tensor:
    """The decoder blocks over hidden states x ([1, R, hidden]): `linear(role, module, x)` runs a
    projection (role: 'qkv', 'o', 'gate_up', 'down'), `attend(layer, block, q, k, v)` stores k, v and
    returns attention as [R, heads, head_dim]. The one loop of every step mode, so they cannot drift."""
    R = x.shape[1]
    H, KV, D = model.n_heads, model.n_kv_heads, model.head_dim
    for i, blk in enumerate(model.blocks):
        q, k, v = roped_heads(blk, linear("qkv", blk.qkv, blk.attn_norm(x)), H, KV, D, cos, sin)  # [1, heads, R, D]
        x = x + linear("o", blk.o, attend(i, blk, q, k, v).reshape(1, R, H * D))
        gate, up = linear("gate_up", blk.gate_up, blk.mlp_norm(x)).chunk(2, dim=-1)
        x = x + linear("down", blk.down, F.silu(gate) * up)
    return x


class Projections:
    """Runs a projection over a forward's rows, each sequence's part on the kernel the plan names for
    ITS row count (`LinearPlan.kernel`): one call for all rows where they share a kernel, one per group
    of sequences sharing one otherwise, one per sequence where the kernel is not row-invariant and the
    role promises alone == batched bits (`LinearPlan.per_sequence`)."""

    def __init__(self, lengths: list[int], linears):
        self.lengths, self.linears = lengths, linears
        self.offsets = [sum(lengths[:b]) for b in range(len(lengths))]
        self.uniform = len(set(lengths)) == 1

    def linear(self, role: str, linear, x: torch.Tensor) -> torch.Tensor:
        lengths, plan = self.lengths, self.linears[role]
        if self.uniform:  # every sequence the same row count: one kernel (the common case, decode rows)
            kernel = plan.kernel(lengths[0])
            if len(lengths) == 1 or not plan.per_sequence(kernel):
                return catalogue.run(kernel, linear, x)
        groups: dict[Kernel, list[int]] = {}
        for b, n in enumerate(lengths):
            groups.setdefault(plan.kernel(n), []).append(b)
        y = x.new_empty(*x.shape[:-1], linear.out_features)
        for kernel, seqs in groups.items():
            parts = [seqs] if not plan.per_sequence(kernel) else [[b] for b in seqs]
            for part in parts:
                if len(part) == 1:  # one sequence's rows are contiguous: a slice (no index tensor to copy
                    rows = slice(self.offsets[part[0]], self.offsets[part[0]] + lengths[part[0]])  # to a GPU)
                else:
                    rows = torch.tensor([self.offsets[b] + j for b in part for j in range(lengths[b])],
                                        dtype=torch.long, device=x.device)
                y[0, rows] = catalogue.run(kernel, linear, x[0, rows][None])[0]
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
