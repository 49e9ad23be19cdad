"""The batching scheduler's names for the one forward (engine/model/forward.py), kept so its callers
(engine/serving/scheduler.py, `python -m engine.bench batch_ceiling`) need not change.

Exactness: a batched row equals the row the same sequence gets alone, bit for bit, in fp32 on CPU:
every projection takes the kernel engine/kernels/choose.py names for its own sequence's row count,
and one that is not row-invariant runs once per sequence. See engine/model/forward.py.
"""

from __future__ import annotations

import torch

from engine.kernels import choose
from engine.model.fast_llama import FastLlama
from engine.model.forward import forward


def supports(model) -> bool:
    """Whether `model` can decode a batch in one forward (our Llama forward on CPU or GPU)."""
    return isinstance(model, FastLlama)


def pack(model) -> None:
    """Make the weight copies the batched forward reads now, not inside its first step (a no-op once made)."""
    choose.prepare(model)


def forward_batch(model: FastLlama, rows: list[list[int]], caches) -> torch.Tensor:
    """Feed sequence b its tokens `rows[b]` at positions [caches[b].length, + len(rows[b])) and
    append their KV, for every b, in one forward. Returns float32 logits [B, vocab] of each
    sequence's last token."""
    return forward(model, rows, caches)
