"""The machine's limits, measured: memory copy bandwidth and matmul throughput per dtype.

Prefill is a few large matmuls (compute-bound); decode reads every weight once per token
(bandwidth-bound). To say how close a reply came to the machine, we need the machine's own
ceilings, not a datasheet's: a 1–2 s probe at first start, cached per machine in the engine's
cache folder with the date it ran, keyed by what changes the answer (CPU model, ISA level,
threads, device). The page can run it again (a button; `Engine.remeasure_limits`).

- copy bandwidth: `dst.copy_(src)` on buffers far larger than the last-level cache, bytes read +
  written per second (the STREAM "copy" convention), best of repeats.
- matmul peak: `torch.mm` of square matrices in each dtype, 2·N³ FLOP per product, N grown until
  one product takes ≥ 20 ms, best of repeats.
On CUDA every timestamp follows `torch.cuda.synchronize()`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.measure import capabilities

log = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FILE_VERSION = 1


@dataclass
class MachineLimits:
    key: dict  # what the figures depend on: cpu_model, isa, threads, device, torch
    measured_at: str  # ISO 8601, UTC
    copy_gbps: float | None  # memory copy bandwidth, GB/s (read + write)
    matmul_tflops: dict = field(default_factory=dict)  # {"fp32": TFLOP/s, ...}
    probe_s: float = 0.0  # how long the probe took
    details: dict = field(default_factory=dict)  # sizes used, repeats

    @property
    def date(self) -> str:
        return self.measured_at[:10]

    def peak_tflops(self, dtype: str | torch.dtype | None) -> float | None:
        if isinstance(dtype, torch.dtype):
            dtype = next((k for k, v in DTYPES.items() if v == dtype), str(dtype))
        return self.matmul_tflops.get(dtype) if dtype else None

    def to_dict(self) -> dict:
        return {**asdict(self), "date": self.date}

    @classmethod
    def from_dict(cls, d: dict) -> MachineLimits:
        return cls(key=d["key"], measured_at=d["measured_at"], copy_gbps=d.get("copy_gbps"),
                   matmul_tflops=dict(d.get("matmul_tflops") or {}), probe_s=d.get("probe_s", 0.0),
                   details=dict(d.get("details") or {}))

    def summary(self) -> str:
        """'copy N GB/s · fp32 matmul N TFLOP/s · bf16 matmul N TFLOP/s (measured YYYY-MM-DD)'."""
        parts = [f"copy {self.copy_gbps:,.1f} GB/s" if self.copy_gbps else "copy —"]
        parts += [f"{k} matmul {v:,.3g} TFLOP/s" for k, v in self.matmul_tflops.items() if v]
        return " · ".join(parts) + f" (measured {self.date})"


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


def load_or_measure(cache_dir: Path | None, device: torch.device | str = "cpu", dtypes=("fp32",),
                    force: bool = False, seconds: float = 1.5) -> MachineLimits:
    """The cached limits of this machine, or a fresh probe (written to the cache) when there are
    none, they lack a dtype asked for, or `force`."""
    key = machine_key(device)
    path = cache_file(cache_dir, key) if cache_dir else None
    if path and path.is_file() and not force:
        try:
            raw = json.loads(path.read_text())
            limits = MachineLimits.from_dict(raw["limits"])
            if raw.get("version") == FILE_VERSION and all(d in limits.matmul_tflops for d in dtypes):
                return limits
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable machine limits %s: %s", path, exc)
    limits = measure(device, dtypes, seconds)
    if path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"version": FILE_VERSION, "limits": limits.to_dict()}, indent=1))
            tmp.replace(path)
        except OSError as exc:
            log.warning("could not cache machine limits at %s: %s", path, exc)
    return limits


def measure(device: torch.device | str = "cpu", dtypes=("fp32",), seconds: float = 1.5) -> MachineLimits:
    """Probe now: about `seconds` in all, split between the copy and each dtype's matmul."""
    device = torch.device(device)
    t0 = time.perf_counter()
    share = seconds / (1 + len(dtypes))
    details = {}
    with torch.inference_mode():
        copy, details["copy"] = copy_gbps(device, share)
        flops = {}
        for name in dtypes:
            try:
                flops[name], details[f"matmul_{name}"] = matmul_tflops(device, DTYPES[name], share)
            except (RuntimeError, KeyError) as exc:  # a dtype this device cannot multiply
                log.warning("matmul probe for %s failed: %s", name, exc)
                details[f"matmul_{name}"] = {"error": str(exc)[:200]}
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return MachineLimits(key=machine_key(device), measured_at=now, copy_gbps=copy, matmul_tflops=flops,
                         probe_s=round(time.perf_counter() - t0, 3), details=details)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_of(fn, device: torch.device, budget_s: float, min_reps: int = 3) -> tuple[float, int]:
    """The shortest time of `fn()` over repeats filling `budget_s` (after one warm-up)."""
    fn()
    _sync(device)
    best, reps, end = float("inf"), 0, time.perf_counter() + budget_s
    while reps < min_reps or time.perf_counter() < end:
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
        reps += 1
        if reps >= 200:
            break
    return best, reps


def copy_gbps(device: torch.device, budget_s: float = 0.4, mib: int | None = None) -> tuple[float, dict]:
    """GB/s of `dst.copy_(src)`, read + written bytes; buffers of `mib` MiB each (default: 64 on
    CPU, far past a last-level cache; 512 on CUDA)."""
    mib = mib or (512 if device.type == "cuda" else 64)
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best, reps = _best_of(lambda: dst.copy_(src), device, budget_s)
    return round(2 * n * 4 / best / 1e9, 2), {"buffer_mib": mib, "reps": reps, "best_s": best}


def matmul_tflops(device: torch.device, dtype: torch.dtype, budget_s: float = 0.4,
                  max_n: int | None = None) -> tuple[float, dict]:
    """TFLOP/s of `torch.mm` on square matrices of `dtype` (2·N³ FLOP per product)."""
    max_n = max_n or (8192 if device.type == "cuda" else 2048)
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.mm(a, b)  # warm-up: the first product of a size pays for thread start and packing
        _sync(device)
        t = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if time.perf_counter() - t >= 0.02 or n >= max_n:
            break
        n *= 2
    best, reps = _best_of(lambda: torch.mm(a, b), device, budget_s)
    return round(2 * n**3 / best / 1e12, 4), {"n": n, "reps": reps, "best_s": best}


def probe_dtypes(loaded_dtype: str, device: torch.device | str = "cpu") -> tuple[str, ...]:
    """The dtypes worth a matmul peak: the loaded one, and bf16 (the usual narrower variant)."""
    out = [loaded_dtype] if loaded_dtype in DTYPES else []
    if "bf16" not in out and loaded_dtype == "fp32":
        out.append("bf16")
    return tuple(out) or ("fp32",)


def main(argv=None) -> int:
    """`python -m engine.measure.machine_limits [--device cuda] [--dtypes fp32,bf16] [--force]`: print the limits."""
    import argparse

    from engine.core.config import LoadConfig
    from engine.model.loader import cache_root

    p = argparse.ArgumentParser(prog="python -m engine.measure.machine_limits", description=main.__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--force", action="store_true", help="measure again even if cached")
    p.add_argument("--no-cache", action="store_true", help="measure, and write nothing")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    root = None if args.no_cache else cache_root(LoadConfig())
    limits = load_or_measure(root, args.device, tuple(args.dtypes.split(",")), force=args.force, seconds=args.seconds)
    print(json.dumps(limits.to_dict(), indent=1))
    print(limits.summary(), f"· probe {limits.probe_s:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
