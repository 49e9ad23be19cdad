"""Measured decisions, kept per machine, and THE timed race between candidates that makes them.

`race(candidates, rounds)`: every candidate runs once per round, the candidates alternating within a
round, each run timed between two done-stamps of the one clock (engine/core/clock.py) on the device
given; the first `warmup` rounds are dropped. Alternating, and comparing candidates by their ratio
within a round (`Race.ratio`), because these machines are shared: a neighbour's load that slows a
whole round cancels out. Every measured choice of the engine goes through it: the execution plan's
kernels (engine/runtime/plan.py), the weight-only activation dtype, the speculative cost table
(engine/speculative/costs.py) and the compiled step's check (engine/runtime/compiled.py).

`cached(cache_dir, folder, key, measure_now)`: a decision that changes the bits of the logits (two
kernels sum in different orders) must not change between restarts, so it is measured once per
machine and kept as JSON under `<cache_dir>/<folder>/`, keyed by what it depends on (`machine_key`:
the CPU and its flags, torch's dispatch level and version, the threads, and what the caller adds),
next to the machine limits (engine/measure/machine_limits.py). Within a process the same key is
answered from memory, cache folder or not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.core import clock
from engine.platform import capabilities

log = logging.getLogger(__name__)
FILE_VERSION = 2  # 2: {key, decision, measured_at}, shared by every cached decision
_MEMO: dict[str, tuple[dict, str]] = {}  # (cache folder, folder, key) -> (decision, source): this process's answers
_MEMO_LOCK = threading.Lock()


class Interrupted(Exception):
    """A race gave way (`should_stop()` was true before a round): nothing was kept."""


@dataclass(frozen=True)
class Race:
    """Seconds of each candidate's run, one per kept round (the warm-up rounds dropped)."""

    times: Mapping[str, list[float]]

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def best(self, name: str) -> float:
        """The least disturbed run: a neighbour's load can only slow a run down."""
        return min(self.times[name])

    def ratio(self, a: str, b: str) -> float:
        """Median over rounds of a's time / the same round's b's time (paired)."""
        return statistics.median(x / y for x, y in zip(self.times[a], self.times[b]))


def race(candidates: Mapping[str, Callable[[], object]], rounds: int, device=None, warmup: int = 1,
         prepare: Callable[[str], object] | None = None, should_stop: Callable[[], bool] | None = None) -> Race:
    """Run each candidate once per round, alternating, `warmup + rounds` rounds; time each run on the
    one clock, after the device's work (`device`: where the candidates run; None: nothing to wait for).
    `prepare(name)`, untimed, before each run (a cache crop, a warm call). `should_stop()` true before
    a round raises Interrupted."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(warmup + rounds):
        if should_stop is not None and should_stop():
            raise Interrupted
        for name, run in candidates.items():
            if prepare is not None:
                prepare(name)
            t0 = clock.done_ns(device)
            run()
            t1 = clock.done_ns(device)
            if r >= warmup:
                times[name].append((t1 - t0) / 1e9)
    return Race(times)


def machine_key() -> dict:
    """What a measured decision depends on, whatever it decides: the CPU and its flags, torch's
    dispatch level and version, the threads. Callers add their own (the model's shape, the kernels)."""
    caps = capabilities.detect()
    return {"cpu_model": caps.cpu_model, "isa": sorted(caps.isa), "cpu_capability": caps.torch_cpu_capability,
            "threads": torch.get_num_threads(), "torch": torch.__version__.split("+")[0]}


def cache_file(cache_dir: Path, key: dict, folder: str) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / folder / f"{digest}.json"


def cached(cache_dir: Path | None, folder: str, key: dict, measure_now: Callable[[], dict],
           valid: Callable[[dict], bool] = lambda d: True, force: bool = False) -> tuple[dict, str]:
    """A measured decision, kept per machine: this process's answer for (`folder`, `key`), else the one
    stored under `<cache_dir>/<folder>/` (where `valid` accepts it), else `measure_now()` (a JSON-able
    dict), stored there. Returns (decision, source): "measured" or "cached (DATE)"."""
    memo = json.dumps([str(cache_dir), folder, key], sort_keys=True)
    with _MEMO_LOCK:
        if not force and memo in _MEMO and valid(_MEMO[memo][0]):
            return _MEMO[memo]
    path = cache_file(cache_dir, key, folder) if cache_dir else None
    found = None
    if path and path.is_file() and not force:
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") == FILE_VERSION and raw["key"] == key and valid(raw["decision"]):
                found = raw["decision"], f"cached ({raw['measured_at'][:10]})"
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("ignoring unreadable decision %s: %s", path, exc)
    if found is None:
        found = measure_now(), "measured"
        if path:
            _write(path, key, found[0])
    with _MEMO_LOCK:
        _MEMO[memo] = found
    return found


def forget() -> None:
    """Drop this process's answers (a test's stand-in for a restart: what is left is the cache folder)."""
    with _MEMO_LOCK:
        _MEMO.clear()


def _write(path: Path, key: dict, decision: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": FILE_VERSION, "key": key, "decision": decision,
                                   "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
        tmp.replace(path)
    except OSError as exc:
        log.warning("could not cache the decision at %s: %s", path, exc)
