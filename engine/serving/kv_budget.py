"""The prefix cache's (KV reuse) memory budget: `--kv-cache-mb auto` (the default) sizes it from the
device the model serves on; a number of MiB the user gives wins. Engine info shows the budget and
where it came from (`PrefixCache.stats()`: budget_bytes, budget_source).

- CUDA: CUDA_FREE_FRACTION (half) of the GPU memory free once the model has loaded
  (`torch.cuda.mem_get_info`). Not all of it: the rest is for what comes after the load and is not
  counted in the cache's budget: running requests' own KV buffers (a batch of 8 at long context),
  prefill activations and logits (a 1,500-token prompt's fp32 logits over a 128k vocabulary are
  ~0.8 GB), weight variants built on first use (--variants-budget-mb defaults to 3x the model's
  weights), CUDA graph pools and the caching allocator's slack. On an 80 GB GPU holding a 16 GB
  model that is ~32 GB: ~250k positions of Llama-8B's KV (128 KiB a position in bf16), where a
  fixed 512 MiB held ~4k, less than one long conversation.
- CPU: CPU_DEFAULT_MB (512 MiB, ~22k positions of SmolLM2-135M in bf16), or a quarter of the
  memory available at start where that is less (psutil), so a small machine does not swap. Not
  more by default: host memory also holds the model, its variants and the page, and a CPU prefills
  so slowly that the contexts worth keeping are few (docs/kv-reuse.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from engine.serving.prefix_cache import DEFAULT_BUDGET_MB, PrefixCache

AUTO = "auto"
CUDA_FREE_FRACTION = 0.5
CPU_DEFAULT_MB = DEFAULT_BUDGET_MB
CPU_AVAILABLE_FRACTION = 0.25
MIB = 2**20


@dataclass(frozen=True)
class KVBudget:
    mb: float
    source: str  # where the figure came from, for engine info


def size(requested: float | str, device, free_bytes: int | None = None,
         available_bytes: int | None = None) -> KVBudget:
    """The budget for `--kv-cache-mb REQUESTED` on `device`. `free_bytes` (CUDA) and `available_bytes`
    (CPU) are read from the device when not given (tests give them)."""
    if requested != AUTO:
        return KVBudget(float(requested), f"--kv-cache-mb {requested:g}")
    device = torch.device(device)
    if device.type == "cuda":
        if free_bytes is None:
            free_bytes, _ = torch.cuda.mem_get_info(device)
        mb = CUDA_FREE_FRACTION * free_bytes / MIB
        return KVBudget(mb, f"auto: {CUDA_FREE_FRACTION:.0%} of the {free_bytes / 2**30:.1f} GiB free on "
                            f"{device} after the model loaded")
    if available_bytes is None:
        available_bytes = psutil.virtual_memory().available
    cap = CPU_AVAILABLE_FRACTION * available_bytes / MIB
    if cap < CPU_DEFAULT_MB:
        return KVBudget(cap, f"auto: {CPU_AVAILABLE_FRACTION:.0%} of the {available_bytes / 2**30:.1f} GiB of "
                             f"memory available at start (less than the CPU default of {CPU_DEFAULT_MB} MiB)")
    return KVBudget(float(CPU_DEFAULT_MB), f"auto: the CPU default of {CPU_DEFAULT_MB} MiB")


def prefix_cache(requested: float | str, device, shared: bool = False) -> PrefixCache:
    """A PrefixCache with the budget `size` gives (call it once the model has loaded)."""
    budget = size(requested, device)
    return PrefixCache(budget.mb, shared=shared, budget_source=budget.source)
