"""The KV cache of one sequence, for our own forward (fast_llama.py).

One preallocated buffer per K and V, shaped [layers, 1, kv_heads, capacity, head_dim], and a
`length`: positions [0, length) hold valid keys and values. Rolling back (speculation, a stale
suffix) is `crop`, which only moves `length`. The buffer grows by reallocation when a request
needs more room, so a short chat does not pay for the whole context window.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device):
        shape = (layers, 1, kv_heads, max(capacity, 1), head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        new_cap = max(needed, int(self.capacity * 1.5))
        for name in ("k", "v"):
            old = getattr(self, name)
            shape = list(old.shape)
            shape[3] = new_cap
            new = torch.empty(shape, dtype=old.dtype, device=old.device)
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)

    def crop(self, length: int) -> None:
        """Forget every position from `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def nbytes(self, positions: int | None = None) -> int:
        """Bytes that `positions` valid positions occupy (default: the current length)."""
        n = self.length if positions is None else positions
        per_position = self.k[:, :, :, :1].numel() * self.k.element_size() * 2
        return per_position * n

    def allocated_bytes(self) -> int:
        return (self.k.numel() + self.v.numel()) * self.k.element_size()

    def copy_prefix(self, length: int | None = None, capacity: int | None = None) -> KVCache:
        """A new cache holding a copy of the first `length` positions."""
        n = self.length if length is None else length
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot copy {n} positions of a cache of length {self.length}")
        layers, _, kv_heads, _, head_dim = self.k.shape
        out = KVCache(layers, kv_heads, head_dim, max(n, capacity or 0), self.k.dtype, self.k.device)
        out.k[:, :, :, :n] = self.k[:, :, :, :n]
        out.v[:, :, :, :n] = self.v[:, :, :, :n]
        out.length = n
        return out
