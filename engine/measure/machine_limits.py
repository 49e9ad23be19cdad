"""The machine's limits, measured: read and copy bandwidth, and matmul throughput per dtype.

Prefill is a few large matmuls (compute-bound); decode reads every weight once per token
(bandwidth-bound). To say how close a reply came to the machine, we need the machine's own
ceilings, not a datasheet's: a probe of a few seconds at first start, cached per machine in the
engine's cache folder with the date it ran, keyed by what changes the answer (CPU model, ISA level,
threads, device). This one probe is the only source of the limits: the page, the API's `timings`
(engine/measure/roofline.py fills the Timeline from it), every bench and `latency-lab report` read
it (`load_or_measure`). The page can run it again (a button; `Engine.remeasure_limits`).

- read bandwidth (`read_gbps`, **decode's roof**: a decode step reads its weights and writes next to
  nothing): the faster of `torch.sum` and, on CPU where our kernels run, our fp32 one-row product, over
  one buffer far larger than the last-level cache, all torch threads, bytes read per second (`ReadProbe`).
- copy bandwidth (`copy_gbps`, for reference): `dst.copy_(src)` on two such buffers, bytes read +
  written per second (the STREAM "copy" convention). Writes cost more than reads, so copy < read.
- matmul peak (`matmul_tflops[dtype]`, prefill's roof): `torch.mm` of square matrices in each dtype,
  2·N³ FLOP per product, N grown until one product takes ≥ 20 ms. "int8" on CPU: `torch._int_mm` (int8
  in, int32 out; 2·N³ operations a product, tera-operations per second), the roof of the w8a variants'
  integer dot products (Kernel.roof): their prefill against the fp32 peak read 66% at 2 threads and
  113% at 1 where it was 16% of this one (AMD EPYC Zen 4: `torch._int_mm` 0.82 against fp32 0.19, 2 threads).
Buffers: `buffer_mib(device)`, one definition for every caller (8× the last-level cache, at least
256 MiB, on CPU; 1 GiB on CUDA). Every timestamp is the one clock's done-stamp (engine/core/clock.py:
on CUDA it follows `torch.cuda.synchronize()`).

**Robust to a busy moment** (the machine is shared): each figure is measured in `rounds` rounds,
interleaved (read, copy, matmul per dtype, then again), so one figure's rounds lie spread over the
whole probe; each round keeps its fastest repeat. A neighbour's load can only make a round slower,
never faster, so the limit is the best round (`aggregate`), and the rounds' spread — (best − worst)
/ best, with the median — is recorded beside it (`details[name]`), so a probe taken while the
machine was busy shows as a wide spread rather than passing for a low roof. A load that lasts the
whole probe still lowers it: re-measure when the machine is idle (`--force`, the page's button).

**A fraction above 100% is a wrong limit, not a result** (`STALE_ABOVE`): a step cannot read faster than
the machine reads, so a step measured above the cached limit says the probe ran while the machine was
busy, or read slower than the step does (why the probe takes the faster of two readers). Whoever sees
one re-measures (`remeasure_if_exceeded`: the benches at once, the engine's publisher at its next idle
moment, engine/measure/roofline.py) and says so (`stale_note`, `remeasured_note`) instead of printing
the fraction; if the fresh probe still reads below the step, the fraction stays withheld.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from engine.platform import capabilities
from engine.core import clock
from engine.core.timeline import peak_unit
from engine.measure.probes import CopyProbe, MatmulProbe, ReadProbe

log = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8}
FILE_VERSION = 2  # 2: read bandwidth, rounds and their spread
ROUNDS = 5


@dataclass
class MachineLimits:
    key: dict  # what the figures depend on: cpu_model, isa, threads, device, torch
    measured_at: str  # ISO 8601, UTC
    copy_gbps: float | None  # memory copy bandwidth, GB/s (read + write): for reference
    matmul_tflops: dict = field(default_factory=dict)  # {"fp32": TFLOP/s, ...}: prefill's roof
    probe_s: float = 0.0  # how long the probe took
    details: dict = field(default_factory=dict)  # per figure: sizes, rounds, best/median/worst, spread
    read_gbps: float | None = None  # memory read bandwidth, GB/s: decode's roof

    @property
    def date(self) -> str:
        return self.measured_at[:10]

    def peak_tflops(self, dtype: str | torch.dtype | None) -> float | None:
        if isinstance(dtype, torch.dtype):
            dtype = next((k for k, v in DTYPES.items() if v == dtype), str(dtype))
        return self.matmul_tflops.get(dtype) if dtype else None

    def decode_fraction(self, gbps: float | None) -> float | None:
        """A decode's bandwidth as a fraction of its roof, the read bandwidth (None where unknown).
        The Timeline's `decode_bandwidth_fraction` is the same division (engine/core/timeline.py)."""
        return gbps / self.read_gbps if gbps is not None and self.read_gbps else None

    def spread(self, name: str) -> float | None:
        """(best − worst) / best over the rounds of one figure ("read", "copy", "matmul_fp32")."""
        return (self.details.get(name) or {}).get("spread")

    def to_dict(self) -> dict:
        return {**asdict(self), "date": self.date}

    @classmethod
    def from_dict(cls, d: dict) -> MachineLimits:
        return cls(key=d.get("key") or {}, measured_at=d.get("measured_at") or "?", copy_gbps=d.get("copy_gbps"),
                   matmul_tflops=dict(d.get("matmul_tflops") or {}), probe_s=d.get("probe_s", 0.0),
                   details=dict(d.get("details") or {}), read_gbps=d.get("read_gbps"))

    def summary(self) -> str:
        """'read N GB/s · copy N GB/s · fp32 matmul N TFLOP/s · … (measured YYYY-MM-DD; spread over 5 rounds ≤ N%)'."""
        parts = [f"read {self.read_gbps:,.1f} GB/s" if self.read_gbps else "read —",
                 f"copy {self.copy_gbps:,.1f} GB/s" if self.copy_gbps else "copy —"]
        parts += [f"{k} matmul {v:,.3g} {peak_unit(k)}" for k, v in self.matmul_tflops.items() if v]
        spreads = [d["spread"] for d in self.details.values() if isinstance(d, dict) and d.get("spread") is not None]
        rounds = max((d.get("rounds_n", 0) for d in self.details.values() if isinstance(d, dict)), default=0)
        tail = f"; rounds spread ≤ {max(spreads):.0%} over {rounds}" if spreads else ""
        return " · ".join(parts) + f" (measured {self.date}{tail})"


STALE_ABOVE = 1.0  # a step's share of a measured limit above this: the limit is stale (probed while busy)


def over_limit(fraction: float | None) -> bool:
    """Whether a fraction of a measured limit says the limit is wrong (above STALE_ABOVE)."""
    return fraction is not None and fraction > STALE_ABOVE


def cache_resident(step_bytes: float | None) -> bool:
    """Whether a step's bytes fit in the last-level cache: it may read them faster than memory (the read
    probe's buffer is 8x the cache), so its share of the read bandwidth above 100% is no sign of a stale limit."""
    llc = llc_bytes()
    return step_bytes is not None and llc is not None and step_bytes <= llc


def exceeded(limits: MachineLimits | None, gbps: float | None = None, tflops: float | None = None,
             dtype: str | None = None, step_bytes: float | None = None) -> list[str]:
    """The limits that observed figures exceed: 'read' (a decode's GB/s above read_gbps, where the step's
    bytes do not fit in the cache: `cache_resident`), 'matmul_DTYPE' (a prefill's TFLOP/s above that peak)."""
    if limits is None:
        return []
    out = ["read"] if over_limit(limits.decode_fraction(gbps)) and not cache_resident(step_bytes) else []
    peak = limits.peak_tflops(dtype)
    if tflops is not None and peak and over_limit(tflops / peak):
        out.append(f"matmul_{dtype}")
    return out


def fraction_text(fraction: float | None, step_bytes: float | None = None) -> str:
    """A fraction as the page and the benches print it: '65%', '—' unknown, never '110%'."""
    if fraction is None:
        return "—"
    if over_limit(fraction):
        return CACHE_NOTE if cache_resident(step_bytes) else STALE_NOTE
    return f"{fraction:.0%}"


CACHE_NOTE = "above the memory's read bandwidth: the step's bytes fit in the last-level cache"
STALE_NOTE = "above the measured limit: limit stale"  # what is shown in place of a share above a stale limit


def stale_note(limits: MachineLimits, what: list[str]) -> str:
    return (f"{STALE_NOTE} ({_limits_words(limits, what)}, probed {limits.date} while the "
            "machine was likely busy); re-measured at the next quiet moment")


def remeasured_note(old: MachineLimits, new: MachineLimits, what: list[str], still: list[str]) -> str:
    if still:
        return (f"above the measured limit even after re-measuring ({_limits_words(old, what)} before, "
                f"{_limits_words(new, what)} now): limit stale (a busy machine while it probed, or a step that reads "
                "faster than the probe's readers); re-measure when the machine is quiet")
    return f"limit re-measured: {_limits_words(old, what)} was stale, {_limits_words(new, what)} now"


def _limits_words(limits: MachineLimits, what: list[str]) -> str:
    words = []
    for name in what:
        if name == "read":
            words.append(f"read {limits.read_gbps:,.1f} GB/s" if limits.read_gbps else "read —")
        else:
            dtype = name.removeprefix("matmul_")
            peak = limits.peak_tflops(dtype)
            words.append(f"{dtype} matmul {peak:,.3g} {peak_unit(dtype)}" if peak else f"{dtype} matmul —")
    return ", ".join(words)


def remeasure_if_exceeded(cache_dir: Path | None, limits: MachineLimits, device: torch.device | str = "cpu",
                          dtypes=("fp32",), gbps: float | None = None, tflops: float | None = None,
                          dtype: str | None = None, seconds: float = 3.0,
                          step_bytes: float | None = None) -> tuple[MachineLimits, str | None]:
    """`limits`, or where an observed figure exceeds them a fresh probe (cached in `cache_dir`), with the note
    that says which: (limits, None) nothing exceeded; (fresh, 'limit re-measured: ...'); (fresh, 'above the
    measured limit even after re-measuring: ...') where the fresh probe still reads below the figure."""
    what = exceeded(limits, gbps, tflops, dtype, step_bytes)
    if not what:
        return limits, None
    log.warning("a step exceeded the measured limits (%s): re-measuring", ", ".join(what))
    fresh = load_or_measure(cache_dir, device, tuple(dict.fromkeys((*dtypes, *(d for d in [dtype] if d in DTYPES)))),
                            force=True, seconds=seconds)
    return fresh, remeasured_note(limits, fresh, what, exceeded(fresh, gbps, tflops, dtype, step_bytes))


def machine_key(device: torch.device | str = "cpu", threads: int | None = None) -> dict:
    caps = capabilities.detect()
    device = torch.device(device)
    key = {"cpu_model": caps.cpu_model, "isa": caps.isa_level, "threads": threads or torch.get_num_threads(),
           "device": device.type, "torch": torch.__version__.split("+")[0]}
    if device.type == "cuda":
        key["cuda_device"] = torch.cuda.get_device_name(device)
    return key


def cache_file(cache_dir: Path, key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "machine-limits" / f"{digest}.json"


def cached(cache_dir: Path | None, device: torch.device | str = "cpu") -> MachineLimits | None:
    """This machine's cached limits, if a probe of the current version wrote them (else None)."""
    path = cache_file(cache_dir, machine_key(device)) if cache_dir else None
    if not (path and path.is_file()):
        return None
    try:
        raw = json.loads(path.read_text())
        return MachineLimits.from_dict(raw["limits"]) if raw.get("version") == FILE_VERSION else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable machine limits %s: %s", path, exc)
        return None


def save(cache_dir: Path, limits: MachineLimits) -> Path | None:
    """Write `limits` as this machine's (atomically); the path, or None where it cannot be written."""
    path = cache_file(cache_dir, limits.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": FILE_VERSION, "limits": limits.to_dict()}, indent=1))
        tmp.replace(path)
        return path
    except OSError as exc:
        log.warning("could not cache machine limits at %s: %s", path, exc)
        return None


def load_or_measure(cache_dir: Path | None, device: torch.device | str = "cpu", dtypes=("fp32",),
                    force: bool = False, seconds: float = 3.0, rounds: int = ROUNDS) -> MachineLimits:
    """The cached limits of this machine, or a fresh probe (written to the cache) when there are
    none, they lack a dtype asked for, or `force`."""
    limits = None if force else cached(cache_dir, device)
    if limits is not None and limits.read_gbps:
        missing = [d for d in dtypes if d not in limits.matmul_tflops]
        if not missing:
            return limits
        # a peak it lacks (a dtype added since): that alone, the rest kept
        extra = measure(device, missing, seconds / 2, rounds, bandwidth=False)
        limits = replace(limits, matmul_tflops={**limits.matmul_tflops, **extra.matmul_tflops},
                           details={**limits.details, **extra.details})
    else:
        limits = measure(device, dtypes, seconds, rounds)
    if cache_dir:
        save(cache_dir, limits)
    return limits


def aggregate(rates: list[float]) -> dict:
    """One figure from its rounds' rates (higher is better): the best is the limit, since a busy
    moment only slows a round down; the median, worst and spread = (best − worst) / best say how
    steady the machine was while it was measured."""
    rates = [r for r in rates if r is not None and r > 0]
    if not rates:
        return {"best": None, "median": None, "worst": None, "spread": None, "rounds_n": 0, "rounds": []}
    best, worst = max(rates), min(rates)
    return {"best": best, "median": statistics.median(rates), "worst": worst,
            "spread": round((best - worst) / best, 4), "rounds_n": len(rates), "rounds": [round(r, 4) for r in rates]}


def measure(device: torch.device | str = "cpu", dtypes=("fp32",), seconds: float = 3.0,
            rounds: int = ROUNDS, bandwidth: bool = True) -> MachineLimits:
    """Probe now: about `seconds` in all, in `rounds` interleaved rounds of every figure (`bandwidth`
    False: the matmul peaks only, read and copy left None)."""
    device = torch.device(device)
    t0 = clock.now_ns()
    mib = buffer_mib(device)
    probes = {"read": ReadProbe(device, mib), "copy": CopyProbe(device, mib)} if bandwidth else {}
    errors = {}
    for name in dtypes:
        try:
            probes[f"matmul_{name}"] = MatmulProbe(device, DTYPES[name])
        except (RuntimeError, KeyError) as exc:  # a dtype this device cannot multiply
            log.warning("matmul probe for %s failed: %s", name, exc)
            errors[f"matmul_{name}"] = {"error": str(exc)[:200]}
    share = seconds / max(1, rounds * len(probes))
    rates: dict[str, list] = {name: [] for name in probes}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, probe in probes.items():
                rates[name].append(probe.round(share))
    details = {name: {**probes[name].info, **aggregate(rates[name])} for name in probes} | errors
    flops = {name.removeprefix("matmul_"): details[name]["best"] for name in probes if name.startswith("matmul_")}
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return MachineLimits(key=machine_key(device), measured_at=now,
                         copy_gbps=_round(details["copy"]["best"], 2) if bandwidth else None,
                         read_gbps=_round(details["read"]["best"], 2) if bandwidth else None,
                         matmul_tflops={k: _round(v, 4) for k, v in flops.items() if v},
                         probe_s=round((clock.done_ns(device) - t0) / 1e9, 3), details=details)


def _round(v, nd):
    return None if v is None else round(v, nd)


def llc_bytes() -> int | None:
    """The last-level cache's size from sysfs (the highest cache level cpu0 reports), None if unknown."""
    best = None
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = int((d / "level").read_text()), (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:].upper(), 1)
        value = int(size.rstrip("KMGkmg")) * mult
        if best is None or level > best[0]:
            best = (level, value)
    return best[1] if best else None


def buffer_mib(device: torch.device | str = "cpu") -> int:
    """The size of each bandwidth buffer, MiB: far past the last-level cache (the one definition)."""
    if torch.device(device).type == "cuda":
        return 1024
    return max(256, 8 * (llc_bytes() or 0) // 2**20)


def probe_dtypes(loaded_dtype: str, device: torch.device | str = "cpu") -> tuple[str, ...]:
    """The dtypes worth a matmul peak: fp32, the loaded one, bf16 where the device has it in hardware
    (AVX512-BF16 or AMX on CPU; CUDA's bf16): emulated bf16 is no roof anyone decodes at; int8 on CPU."""
    caps = capabilities.detect()
    out = ["fp32"] + ([loaded_dtype] if loaded_dtype in DTYPES and loaded_dtype != "fp32" else [])
    cpu = torch.device(device).type == "cpu"
    has_bf16 = caps.native_bf16 if cpu else caps.cuda_bf16
    if "bf16" not in out and has_bf16:
        out.append("bf16")
    if "int8" not in out and cpu:  # the w8a variants' roof (Kernel.roof), which the page may build at any time
        out.append("int8")
    return tuple(out)
