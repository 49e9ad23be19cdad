"""The roofline of one reply: how close prefill came to the matmul peak, and decode to the read bandwidth.

The runtime counts a reply's work (engine/serving/work.py: prefill FLOPs, decode steps and the bytes
they read); this module stamps the machine's limits beside them, and the Timeline turns the two into
`prefill_tflops`, `prefill_compute_fraction`, `decode_gbps` and `decode_bandwidth_fraction`. The
limits are the measured ones (machine_limits.py) of the device the model runs on: on CUDA the GPU's
(its HBM read GB/s, its matmul peak in the model's compute dtype, bf16 or fp16 on the tensor cores),
never the host's. Limits probed on another device than the model's are not used (`limits_for`): the
fractions stay unknown rather than divide GPU work by a CPU's roof.

`Roofline` is the publisher the entry point registers on an Engine (engine/lab.py `attach`): the worker
calls it as a reply finishes, before the done event goes out; it also re-probes (the page's button).
"""

from __future__ import annotations

import logging

from torch import nn

from engine.core.timeline import Timeline
from engine.serving.work import record

log = logging.getLogger(__name__)


def model_device(model) -> str | None:
    """The device type ('cuda', 'cpu') the model's weights are on (None: unknown)."""
    device = getattr(model, "device", None)
    if device is None and isinstance(model, nn.Module):
        device = next((p.device for p in model.parameters()), None)
    return getattr(device, "type", None) or (str(device).split(":")[0] if device is not None else None)


def limits_for(limits, device: str | None):
    """`limits` where they were measured on `device`'s type, else None: a CUDA model's roofline
    divides by the GPU's probe (machine_limits.py keys each probe by its device), never by the
    host's. Limits without a device in their key (made by hand) are taken as they are."""
    if limits is None:
        return None
    measured_on = (getattr(limits, "key", None) or {}).get("device")
    return limits if measured_on is None or device is None or measured_on == device else None


def publish(timeline: Timeline, limits, dtype: str | None, device: str | None) -> None:
    """Stamp the machine's limits for `device` (the model's device type) on a finished reply's Timeline;
    None where they were measured on another device (the roofs stay unknown)."""
    limits = limits_for(limits, device)
    timeline.peak_tflops = limits.peak_tflops(dtype) if limits is not None else None
    timeline.read_gbps = limits.read_gbps if limits is not None else None  # decode's roof: the fraction divides by it
    timeline.copy_gbps = limits.copy_gbps if limits is not None else None
    timeline.limits_date = limits.date if limits is not None else None


def annotate(timeline: Timeline, model, weight_bytes: int | None, limits=None, dtype: str | None = None,
             config=None, device: str | None = None) -> None:
    """What the worker and its publisher do for a reply, in one call (benches that run generate()
    themselves): count its work and stamp the limits of `device` (default: where the model's weights are)."""
    record(timeline, model, weight_bytes, dtype, config)
    publish(timeline, limits, dtype, device or model_device(model))


class Roofline:
    """The machine's limits as an Engine's publisher: stamps each finished reply (`__call__`, in the
    worker thread), and probes the machine again on request (`remeasure`, cached in `cache_dir`)."""

    def __init__(self, limits, cache_dir=None):
        self.limits, self.cache_dir = limits, cache_dir

    def __call__(self, timeline: Timeline, variant) -> None:
        loaded = variant.loaded
        publish(timeline, self.limits, getattr(loaded, "dtype_name", None), model_device(loaded.model))

    def to_dict(self) -> dict | None:
        return self.limits.to_dict() if self.limits is not None else None

    def remeasure(self, device, dtype_name: str, seconds: float = 3.0):
        """Probe the machine again and cache the result (it shares the CPU with a running reply: run it
        when the engine is idle for a clean figure)."""
        from engine.measure.machine_limits import load_or_measure, probe_dtypes

        self.limits = load_or_measure(self.cache_dir, device, probe_dtypes(dtype_name, device), force=True,
                                      seconds=seconds)
        return self.limits
