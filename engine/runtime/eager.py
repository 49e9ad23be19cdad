"""The eager forward of our Llama-family model (`FastLlama`): B sequences, one sequence being a batch of one.

Every sequence brings its next tokens — one for a decode step, a prompt (chunk) or a speculative
verify's several — and its own `KVCache` (its own length). The projections and the MLP run as one
matmul over all rows where their kernel allows (a decode step is memory-bound: the weights are read
once for all); attention runs over each sequence's own cache: no padding, and exactly the
computation the sequence would get alone. Decode rows (one token) go through our attention kernel
in one call a layer for all of them (engine/kernels/cpu_attention.py, which also stores their keys
and values) where the plan says so, one call per cache precision (the kv_cache_dtype toggle: a cache's
`kind`, `Plan.attention_for`); other rows take one SDPA call per sequence with its own causal mask,
over the cache as `KVCache.read` gives it (the model's dtype: views; fp16/bf16/int8: widened).

Kernels: every projection runs the kernel the plan (engine/runtime/plan.py) names for ITS sequence's
row count, never the forward's total, so a sequence's kernels — and bits — do not depend on who
shares the forward; a kernel that is not row-invariant runs once per sequence. So greedy fp32 output
is the same alone, batched, and through either worker.

Layer loop: `blocks` (engine/runtime/blocks.py) in Python is the reference; where the plan sends
every projection's rows to our kernels (`Plan.loop_rows`: up to `cpp_rows` rows, caches at the precisions
of `loop_kv`), engine/kernels/cpu_layers.cpp runs the same loop in one C++ call (tested bit-equal). The
runner (engine/runtime/runner.py) calls this.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from engine.kernels import cpu_attention, cpu_layers
from engine.runtime.blocks import Projections, blocks


@torch.inference_mode()
def forward(model, plan, rows, caches, all_logits: bool = False, layers=None) -> torch.Tensor:
    """Feed sequence b its tokens `rows[b]` (a list of ids or a 1-D tensor) at positions
    [caches[b].length, + len(rows[b])) and append their KV, for every b, in one forward, with the
    kernels `plan` names. Returns float32 logits: [B, vocab], each sequence's last token; with
    all_logits every row's, [R, vocab] (one sequence: [T, vocab]). `layers`: what the C++ layer loop
    reads (cpu_layers.layer_weights; the runner keeps it), made here where the plan runs that loop."""
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
    masks = [None if n == 1 or s == 0 else _prefix_causal(s, n, device)
             for s, n in zip(starts, lengths)]  # new tokens see the cached prefix, and causally each other
    offsets = [sum(lengths[:b]) for b in range(B)]  # sequence b's first row
    kinds = [getattr(c, "kind", "model") for c in caches]  # each cache's precision (engine/model/kv_cache.py)
    paths = [plan.attention_for(kv) for kv in kinds]
    decode = [b for b, n in enumerate(lengths) if n == 1 and paths[b] != "sdpa"]  # rows through our attention kernel
    others = [b for b, n in enumerate(lengths) if not (n == 1 and paths[b] != "sdpa")]  # through SDPA
    if max(lengths) <= plan.loop_rows(kinds):  # the same loop in one C++ call: the same bits, far fewer hand-offs
        layers = layers or cpu_layers.layer_weights(model, plan.w8a_form, plan.head_norm, plan.w8a_hardware_stream)
        x = cpu_layers.run_layers(model, layers, ids, cos, sin, caches, starts, lengths, offsets, decode, others,
                                  masks, not all_logits)  # with the head where layers has it
    else:
        attend = _attention(model, caches, starts, lengths, offsets, decode, others, masks)
        x = blocks(model, model.embed(ids[None]), cos, sin, Projections(lengths, plan.linears).linear, attend)
    for c, s, n in zip(caches, starts, lengths):
        c.length = s + n
    if x.dim() == 2:  # the logits: the C++ call ran the head too (layer_weights keeps it where plan.head_norm)
        return x
    if all_logits:
        head_lengths = lengths
    else:
        head_lengths = [1] * B
        x = x[:, -1:] if B == 1 else x[:, torch.tensor([o + n - 1 for o, n in zip(offsets, lengths)], device=device)]
        if plan.head_norm:  # the final norm folded into the head's integer product: the same bits, one call
            return model.lm_head.normed_product(x, model.norm)
    return Projections(head_lengths, plan.linears).linear("lm_head", model.lm_head, model.norm(x))[0].float()


def _prefix_causal(start: int, n: int, device: torch.device):
    """The mask of n new tokens after `start` cached ones: each sees the prefix and the new tokens up to
    itself. On a GPU a lower-right causal bias, which SDPA's flash and memory-efficient kernels take (a
    boolean mask rules flash out); on CPU the boolean mask, whose bits the exactness tests pin."""
    if device.type == "cuda":
        return causal_lower_right(n, start + n)
    return torch.ones(n, start + n, dtype=torch.bool, device=device).tril(diagonal=start)


def _attention(model, caches, starts, lengths, offsets, decode, others, masks):
    """The eager forward's `attend`: decode rows through our kernel (one call per cache precision), the
    others through SDPA."""
    H, KV, D = model.n_heads, model.n_kv_heads, model.head_dim
    groups: dict[str, list[int]] = {}  # a cache precision -> its decode sequences
    for b in decode:
        groups.setdefault(getattr(caches[b], "kind", "model"), []).append(b)
    kernels = {kv: cpu_attention.decode_attention_heads if kv == "model" else cpu_attention.decode_attention_kv
               for kv in groups}
    rows = {kv: torch.tensor([offsets[b] for b in bs], device=model.device) for kv, bs in groups.items()} \
        if others or len(groups) > 1 else None

    def attend(i, blk, q, k, v):
        if rows is None:  # decode only, one precision: rows are sequences, in order
            return kernels[next(iter(groups))](
                q, k, v, caches, range(len(caches)), starts, i, blk.scaling)
        R = q.shape[2]
        attn = q.new_empty(R, H, D)
        for kv, bs in groups.items():
            attn[rows[kv]] = kernels[kv](q, k, v, [caches[b] for b in bs], [offsets[b] for b in bs],
                                         [starts[b] for b in bs], i, blk.scaling)
        for b in others:
            c, s, n, row = caches[b], starts[b], lengths[b], offsets[b]
            c.store(i, s, k[:, :, row : row + n], v[:, :, row : row + n])
            keys, values = c.read(i, s + n)
            attn[row : row + n] = F.scaled_dot_product_attention(
                q[:, :, row : row + n], keys, values, attn_mask=masks[b],
                is_causal=n > 1 and s == 0, scale=blk.scaling, enable_gqa=H != KV)[0].transpose(0, 1)
        return attn

    return attend


