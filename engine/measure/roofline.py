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
A reply that streamed faster than a limit (a fraction above 100%: machine_limits.STALE_ABOVE) says the
limit is stale: its Timeline gets `limits_note` ('above the measured limit: limit stale ...', which the
page shows instead of the fraction), and the publisher re-probes at the worker's next idle moment (`idle`,
never inside a reply: a probe takes seconds of both cores); later replies carry 'limit re-measured ...'. Where
the fresh probe still reads below the reply, later replies above it carry that finding and the publisher does not
probe again by itself (each probe would take the cores after every reply); the page's button still does.
"""

from __future__ import annotations

import logging

from torch import nn

from engine.core.timeline import Timeline
from engine.measure.machine_limits import CACHE_NOTE, exceeded, over_limit, remeasured_note, stale_note
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
    timeline.limits_note = None


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
        self.pending: dict | None = None  # a reply exceeded the limits: what to re-probe at the next idle moment
        self.note: str | None = None  # what the last re-probe after such a reply found (on replies under it)
        self.unresolved: set[str] = set()  # limits that re-probe still found below a reply: not re-probed by itself again

    def __call__(self, timeline: Timeline, variant) -> None:
        loaded = variant.loaded
        dtype, device = timeline.compute_dtype, model_device(loaded.model)  # its prefill's roof (the worker's choice)
        publish(timeline, self.limits, dtype, device)
        limits = limits_for(self.limits, device)
        step = timeline.decode_bytes / timeline.decode_steps if timeline.decode_bytes and timeline.decode_steps else None
        what = exceeded(limits, timeline.decode_gbps, timeline.prefill_tflops, dtype, step)
        if over_limit(timeline.decode_bandwidth_fraction) and "read" not in what:
            timeline.limits_note = CACHE_NOTE  # a model that fits in the cache: no stale limit, no share either
        if what and set(what) <= self.unresolved:  # re-probed once already, still below: said, not probed again
            timeline.limits_note = self.note
        elif what:  # a wrong limit, not a result: said, and re-probed when the engine is idle
            timeline.limits_note = stale_note(limits, what)
            seen = self.pending or {}
            self.pending = {"device": loaded.device, "dtype": dtype, "what": what, "step": step,
                            "gbps": max(timeline.decode_gbps or 0, seen.get("gbps") or 0) or None,
                            "tflops": max(timeline.prefill_tflops or 0, seen.get("tflops") or 0) or None}
        elif limits is not None and timeline.limits_note is None:
            timeline.limits_note = self.note

    def idle(self) -> bool:
        """The worker's idle work: re-probe the limits a reply exceeded (True: it did)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return False
        old = self.limits
        self.remeasure(pending["device"], pending["dtype"])
        still = exceeded(self.limits, pending["gbps"], pending["tflops"], pending["dtype"], pending["step"])
        self.note, self.unresolved = remeasured_note(old, self.limits, pending["what"], still), set(still)
        log.warning("%s", self.note)
        return True

    def to_dict(self) -> dict | None:
        return self.limits.to_dict() if self.limits is not None else None

    def remeasure(self, device, dtype_name: str, seconds: float = 3.0):
        """Probe the machine again and cache the result (it shares the CPU with a running reply: run it
        when the engine is idle for a clean figure)."""
        from engine.measure.machine_limits import load_or_measure, probe_dtypes

        held = self.limits.matmul_tflops if self.limits is not None else {}  # every peak held now, probed again
        dtypes = tuple(dict.fromkeys([*probe_dtypes(dtype_name, device), *held]))
        self.limits = load_or_measure(self.cache_dir, device, dtypes, force=True, seconds=seconds)
        self.note, self.unresolved = None, set()
        return self.limits
