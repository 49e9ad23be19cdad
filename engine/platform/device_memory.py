"""Memory on an accelerator, as torch's caching allocator and the driver report it: what a weights
variant on CUDA occupies is GPU memory, not the host process's resident set (which the variants'
`memory_bytes` measure on a CPU, engine/serving/variants.py). One helper for every caller: the prepared
GPU check (engine/bench/gpu.py) and, on CUDA, the variants' memory figures."""

from __future__ import annotations

import torch


def device_memory(device) -> dict | None:
    """{"allocated_bytes", "peak_allocated_bytes", "free_bytes", "total_bytes"} of a CUDA device
    (torch's allocations now and at their peak; the driver's free and total); None on any other
    device, whose memory is the host's."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated_bytes": torch.cuda.memory_allocated(device),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(device), "free_bytes": free, "total_bytes": total}
