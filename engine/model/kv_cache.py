"""The KV cache of one sequence, for our own forward (fast_llama.py).

One preallocated buffer per K and V, shaped [layers, 1, kv_heads, capacity, head_dim], and a
`length`: positions [0, length) hold valid keys and values. Rolling back (speculation, a stale
suffix) is `crop`, which only moves `length`. The buffer grows by reallocation when a request
needs more room, so a short chat does not pay for the whole context window.

Its precision (`kind`, the kv_cache_dtype toggle: engine/core/config.py KV_CACHE_DTYPES):
- "model": the model's dtype; `store` and `read` are a slice assignment and a view, as they always were;
- "fp16" / "bf16": the buffers in 16 bits, read back widened to the model's dtype;
- "int8": the buffers in int8 and, beside them, one fp32 scale per head per position (`k_scale`,
  `v_scale`: [layers, 1, kv_heads, capacity]): symmetric, scale = max|x| / 127 over the head's
  head_dim values, q = round-half-even(x / scale) (0 where the head's values are all 0):
  engine/kernels/cpu_attention.py `quantize_int8`, the rule our decode attention kernel keeps when it
  stores a decode row (cpu_attention.cpp), so a position's bits do not depend on who stored it.
`bytes_per_position` is the one definition of what a position of context costs to keep and to read
(the roofline's KV bytes: engine/serving/work.py, `bench bandwidth`).

On the CPU a buffer of 2 MB or more lives in transparent huge pages (engine/platform/hugepages.py): a decode
step reads the whole cache, and past a long prompt it is as large as the 4-bit weights, which live there too.
`int4w8a+head8` after 1,400 tokens stepped in 0.94x the time with its cache in 2 MB pages (16 rounds in one
process, alternating; fp32 weights 0.98x; at 256 tokens no change): docs/quantization-w8a-2026-12-05.md.
"""

from __future__ import annotations

import math

import torch

from engine.core.config import KV_CACHE_DTYPES
from engine.kernels.cpu_attention import STORAGE, quantize_int8  # the one rule, which our kernel keeps too
from engine.platform import hugepages

SCALE_BYTES = 4  # int8: one fp32 scale per head per position, for K and for V


def storage_dtype(kind: str, model_dtype: torch.dtype) -> torch.dtype:
    if kind not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {kind!r}")
    return STORAGE.get(kind, model_dtype)


def bytes_per_position(kind: str, model_dtype: torch.dtype, layers: int, kv_heads: int, head_dim: int) -> int:
    """Bytes one position of context takes in a cache of `kind` (keys and values of every layer, and the
    int8 scales): what a decode step reads per token of context."""
    element = storage_dtype(kind, model_dtype).itemsize
    per_head = head_dim * element + (SCALE_BYTES if kind == "int8" else 0)
    return 2 * layers * kv_heads * per_head


def _buffer(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised cache buffer: in huge pages on the CPU where it spans one or more, else torch's."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type == "cpu" and nbytes >= hugepages.HUGE:
        return hugepages.region(nbytes).view(dtype).view(shape)
    return torch.empty(shape, dtype=dtype, device=device)


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device, kind: str = "model"):
        shape = (layers, 1, kv_heads, max(capacity, 1), head_dim)
        self.kind, self.compute_dtype = kind, dtype
        store = storage_dtype(kind, dtype)
        self.k = _buffer(shape, store, device)
        self.v = _buffer(shape, store, device)
        self.k_scale = self.v_scale = None
        if kind == "int8":
            self.k_scale = _buffer(shape[:4], torch.float32, device)
            self.v_scale = _buffer(shape[:4], torch.float32, device)
        self.length = 0

    def _buffers(self) -> tuple[str, ...]:
        return ("k", "v", "k_scale", "v_scale") if self.kind == "int8" else ("k", "v")

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        new_cap = max(needed, int(self.capacity * 1.5))
        for name in self._buffers():
            old = getattr(self, name)
            shape = list(old.shape)
            shape[3] = new_cap
            new = _buffer(shape, old.dtype, old.device)
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep k, v ([1, kv_heads, n, head_dim], the model's dtype) at positions [start, start + n) of `layer`."""
        end = start + k.shape[2]
        if self.kind == "int8":
            self.k[layer, :, :, start:end], self.k_scale[layer, :, :, start:end] = quantize_int8(k)
            self.v[layer, :, :, start:end], self.v_scale[layer, :, :, start:end] = quantize_int8(v)
        else:  # "model": the same slice assignment as ever; fp16/bf16: the copy rounds to nearest
            self.k[layer, :, :, start:end] = k
            self.v[layer, :, :, start:end] = v

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions [0, end) of `layer`, [1, kv_heads, end, head_dim] in the model's dtype
        (for "model": views of the buffers, no copy)."""
        k, v = self.k[layer, :, :, :end], self.v[layer, :, :, :end]
        if self.kind == "model":
            return k, v
        if self.kind == "int8":
            k = k.float() * self.k_scale[layer, :, :, :end, None]
            v = v.float() * self.v_scale[layer, :, :, :end, None]
        return k.to(self.compute_dtype), v.to(self.compute_dtype)

    def crop(self, length: int) -> None:
        """Forget every position from `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def nbytes(self, positions: int | None = None) -> int:
        """Bytes that `positions` valid positions occupy (default: the current length)."""
        n = self.length if positions is None else positions
        layers, _, kv_heads, _, head_dim = self.k.shape
        return bytes_per_position(self.kind, self.compute_dtype, layers, kv_heads, head_dim) * n

    def allocated_bytes(self) -> int:
        return sum(getattr(self, b).numel() * getattr(self, b).element_size() for b in self._buffers())

    def copy_prefix(self, length: int | None = None, capacity: int | None = None) -> KVCache:
        """A new cache holding a copy of the first `length` positions."""
        n = self.length if length is None else length
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot copy {n} positions of a cache of length {self.length}")
        layers, _, kv_heads, _, head_dim = self.k.shape
        out = KVCache(layers, kv_heads, head_dim, max(n, capacity or 0), self.compute_dtype, self.k.device, self.kind)
        for name in self._buffers():
            getattr(out, name)[:, :, :, :n] = getattr(self, name)[:, :, :, :n]
        out.length = n
        return out
