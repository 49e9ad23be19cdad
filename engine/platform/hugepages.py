"""Memory in transparent huge pages (2 MB) where Linux offers them, for what a decode step streams: the w8a
variants' weights (engine/quant/w8a.py) and the KV caches (engine/model/kv_cache.py).

Why: a one-row product reads each weight once, so with 4 KB pages every 4 KB of weights is a TLB miss
and a page walk, and the hardware prefetcher stops at each page's end. The quantized variants' 4-bit
layers (~66 MB of small tensors for the bundled model) streamed ~13% faster gathered into one region in
huge pages (1 thread, AMD EPYC Zen 4, 2026-12-05: the model's 120 layers 4.26 -> 3.70 ms;
docs/quantization.md). torch's CPU allocator gives no huge pages (its blocks are neither 2 MB-aligned
nor advised), so this module maps the region itself and hands out a tensor over it.

Where the kernel has THP off ("never" in /sys/kernel/mm/transparent_hugepage/enabled) or the platform
has no madvise, the region is ordinary memory: the same tensor, the same bits, no gain.
"""

from __future__ import annotations

import mmap

import torch

HUGE = 2 << 20


def region(nbytes: int) -> torch.Tensor:
    """A zeroed uint8 tensor of `nbytes` on the CPU, starting on a 2 MB boundary and advised for huge
    pages. The mapping lives as long as a tensor (or a view) over it."""
    buf = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
    offset = (-start) % HUGE
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, offset, nbytes + HUGE - offset)
        except OSError:  # THP not built in: ordinary pages
            pass
    return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)


def gather(tensors: list[torch.Tensor], align: int = 16) -> list[torch.Tensor]:
    """Copies of `tensors` (CPU, contiguous) side by side in one huge-page region, each starting on an
    `align`-byte boundary: the same values, shapes and dtypes."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    starts, at = [], 0
    for n in sizes:
        starts.append(at)
        at += -(-n // align) * align
    base = region(max(at, 1))
    out = []
    for t, s, n in zip(tensors, starts, sizes):
        view = base[s:s + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
    return out
