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

Regions are reused: a region no tensor holds any more serves the next one of about its size, zeroed
again. A region's first touch costs the kernel's zeroing of each 2 MB page and, in a VM, the host's
own faults: a 47 MB region took 43-61 ms to touch first and 1.5 ms to zero again (AMD EPYC Zen 4 VM,
2026-12-06; 12 ms in 4 KB pages), and every request's KV cache is such a region, grown into a new one
when a chat's next turn extends it (docs/kv-reuse.md).
"""

from __future__ import annotations

import mmap
import sys
import threading

import torch

HUGE = 2 << 20
IDLE_BYTES = 256 << 20  # idle regions kept for reuse, at most (checked at each call); past it the least recently used are unmapped
REUSE_SLACK = 1.5  # a region serves a tensor of at least 1 / REUSE_SLACK of its size (no more room idles)

_regions: list[mmap.mmap] = []  # every region mapped and not yet unmapped, least recently handed out first
_lock = threading.Lock()


def _refs(regions: list, i: int) -> int:
    return sys.getrefcount(regions[i])


# A region's references when only _regions holds it: a tensor over it (and every view of that tensor)
# holds one more, through its storage, until the last of them is freed.
_IDLE_REFS = _refs([object()], 0)


def region(nbytes: int) -> torch.Tensor:
    """A zeroed uint8 tensor of `nbytes` on the CPU, starting on a 2 MB boundary and advised for huge
    pages: an idle region of about its size zeroed again, else a new one. The mapping lives as long as
    a tensor (or a view) over it, and after that while it is kept for reuse."""
    with _lock:
        _trim()  # regions freed since the last call count now
        buf = _reuse(nbytes)
    if buf is not None:
        return torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=_offset(buf)).zero_()
    buf = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = _offset(buf)
    if hasattr(buf, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE, offset, nbytes + HUGE - offset)
        except OSError:  # THP not built in: ordinary pages
            pass
    t = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
    with _lock:
        _regions.append(buf)
    return t


def _offset(buf: mmap.mmap) -> int:
    """Bytes from the mapping's start to its first 2 MB boundary."""
    return (-torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()) % HUGE


def _idle() -> list[int]:
    """Indices in _regions of the regions no tensor holds, least recently handed out first (under _lock)."""
    return [i for i in range(len(_regions)) if _refs(_regions, i) == _IDLE_REFS]


def _reuse(nbytes: int) -> mmap.mmap | None:
    """The smallest idle region that fits `nbytes` within REUSE_SLACK, moved to the back (under _lock)."""
    need = nbytes + HUGE
    fits = [i for i in _idle() if need <= len(_regions[i]) <= REUSE_SLACK * need]
    if not fits:
        return None
    buf = _regions.pop(min(fits, key=lambda i: len(_regions[i])))
    _regions.append(buf)
    return buf


def _trim() -> None:
    """Unmap the least recently handed out idle regions past IDLE_BYTES (under _lock)."""
    idle = _idle()
    total, drop = sum(len(_regions[i]) for i in idle), []
    for i in idle:
        if total <= IDLE_BYTES:
            break
        total -= len(_regions[i])
        drop.append(i)
    for i in reversed(drop):
        _regions.pop(i).close()


def idle_bytes() -> int:
    """Bytes of regions no tensor holds, kept for reuse."""
    with _lock:
        return sum(len(_regions[i]) for i in _idle())


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
