"""THE one clock of the project: every time the engine, the Timeline and the benches take is read here.

`now_ns()` reads the clock (`time.perf_counter_ns`: monotonic, the server's one clock; engine/measure/
otel.py maps it to the epoch once). A device that runs asynchronously (CUDA, MPS) returns from a
launch before the work is done, so a reading right after a launch stamps the launch, not the work:
`done_ns(device)` / `done_s(device)` first wait for the device (`sync`), then read the clock — a
stamp that claims work is done. On CPU (and "meta") there is nothing to wait for.

`device`: a torch.device, a string ("cuda:0"), a tensor or a module (its `.device`, else its first
parameter's); None stamps without waiting (for a time that claims no device work).

Test hook: `syncs` counts every wait asked for with a device, whatever the device (CPU included), and
each of `listeners` is called with the device; so a CPU test can prove a timer goes through the clock.
Hand-written, not a library: two torch calls and a counter.
"""

from __future__ import annotations

import time

syncs = 0  # waits asked for with a device (test hook; CPU ones count too)
listeners: list = []  # callables f(torch.device), called on each of those waits (test hook)

now_ns = time.perf_counter_ns


def device_of(device):
    """The torch.device that `device` names or holds, or None (see the module's docstring)."""
    import torch

    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        return torch.device(device)
    if isinstance(device, torch.Tensor):
        return device.device
    found = getattr(device, "device", None)
    if found is not None:
        return device_of(found)
    if isinstance(device, torch.nn.Module):
        param = next(device.parameters(), None)
        return param.device if param is not None else None
    raise TypeError(f"no device in {type(device).__name__}")


def sync(device) -> None:
    """Wait until `device` has done all the work launched on it (nothing to wait for on CPU)."""
    global syncs
    device = device_of(device)
    if device is None:
        return
    syncs += 1
    for listener in listeners:
        listener(device)
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
    elif device.type == "mps":
        import torch

        torch.mps.synchronize()


def done_ns(device) -> int:
    """The clock once `device` has done its work: a stamp that claims the work is done."""
    sync(device)
    return now_ns()


def done_s(device) -> float:
    """`done_ns` in seconds."""
    return done_ns(device) / 1e9
