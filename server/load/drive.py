"""Running the load: the memory sampler, and `run_load` (every level, `repeat` times, with the
checks after each level). The clients: clients.py; the engines it runs against: scenario.py.
"""

from __future__ import annotations

import gc
import threading
import time

from .clients import drive_elsewhere
from .figures import BAD, COMPLETE, level_row
from .pool import Result, ScriptedConversation
from .reuse import ThinkTime, cache_counts, cache_figures, counts_diff, kv_budget, reuse_figures

# RSS besides the KV cache may grow this much from the first run to the last (allocator noise is far
# less: docs/reliability.md); a leak of each request's KV (~3 MB fp32 x ~20 requests a run) is far more.
MEMORY_GROWTH_LIMIT_MB = 32


# --- memory --------------------------------------------------------------------------------------
class MemorySampler:
    """Process RSS and prefix-cache bytes, every `every` seconds on a thread, tagged by phase."""

    def __init__(self, prefix_cache=None, every: float = 0.25):
        import psutil

        self.process = psutil.Process()
        self.prefix_cache = prefix_cache
        self.every = every
        self.phase = "start"
        self.samples: list[tuple[str, int, int]] = []  # (phase, rss bytes, kv bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def sample(self) -> tuple[int, int]:
        kv = self.prefix_cache.stats()["bytes"] if self.prefix_cache is not None else 0
        s = (self.phase, self.process.memory_info().rss, kv)
        self.samples.append(s)
        return s[1], s[2]

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def settled_rss(sampler: MemorySampler) -> tuple[int, int]:
    """(RSS, prefix-cache bytes) once garbage is collected and freed heap returned to the OS
    (where glibc allows), so what is left is what is held."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return sampler.sample()


# --- the load, level by level ----------------------------------------------------------------------
def server_5xx(url: str) -> float:
    """5xx answers the server counted (`api_errors_total`), also those no client was left to see."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "latency_lab:api_errors_total" and s.labels.get("status", "").startswith("5"))


def wait_idle(engine, timeout: float = 30.0) -> bool:
    """Nothing queued, nothing running (cancelled requests included) within `timeout`."""
    worker = getattr(engine, "worker", None)
    if worker is None:
        return True
    deadline = time.monotonic() + timeout
    while worker.busy or worker.queue_depth():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_load(engine, url: str, pool: list[ScriptedConversation], levels, *, duration: float, max_requests: int,
             cancel_every: int, deadline: float, repeat: int, sampler: MemorySampler, out=print,
             api_key: str | None = None, think: ThinkTime | None = None, kv_budget_mb: float | None = None) -> dict:
    """Every level, `repeat` times; rows per level (all runs pooled), counts, memory run over run. The
    clients run in a process of their own (clients.py), as real clients do. `think`: the clients' pause
    between turns; `kv_budget_mb`: the prefix cache's budget for the run (reuse.py); each row has the
    level's KV reuse figures (follow-up vs first turns, the cache's hit rate and evictions)."""
    with kv_budget(engine, kv_budget_mb):
        return _run_load(engine, url, pool, levels, duration, max_requests, cancel_every, deadline, repeat, sampler,
                         out, api_key, think)


def _run_load(engine, url, pool, levels, duration, max_requests, cancel_every, deadline, repeat, sampler, out,
              api_key, think) -> dict:
    by_level: dict[int, list[tuple[list[Result], float]]] = {n: [] for n in levels}
    cache: dict[int, dict | None] = dict.fromkeys(levels)  # the prefix cache's counts over each level
    kv_peak: dict[int, int] = dict.fromkeys(levels, 0)  # ...and its peak bytes
    first_sample = len(sampler.samples)  # this load's samples only (several loads may share a sampler)
    runs, stuck_workers, server_errors = [], 0, 0
    for run_i in range(repeat):
        sampler.phase = f"run{run_i + 1}"
        for n in levels:
            at = len(sampler.samples)
            errors_before, counts_before = server_5xx(url), cache_counts(engine)
            results, wall = drive_elsewhere(url, pool, n, duration, max_requests, cancel_every, deadline, api_key,
                                            think=think)
            if not wait_idle(engine):
                stuck_workers += 1
            server_errors += server_5xx(url) - errors_before
            cache[n] = counts_diff(counts_before, cache_counts(engine), cache[n])
            kv_peak[n] = max([kv_peak[n], *(sample[2] for sample in sampler.samples[at:])])
            by_level[n].append((results, wall))
            row = level_row(n, results, wall)
            out(f"run {run_i + 1}, {n:>2} clients: {row['requests']} requests, {row['exact']} exact, "
                f"{row['cancelled']} cancelled, " + ", ".join(f"{k} {row[k]}" for k in BAD) +
                f" | ttft p50 {row['ttft_ms_p50']} ms, queue p50 {row['queue_ms_p50']} ms, "
                f"{row['req_per_s']} req/s")
        rss, kv = settled_rss(sampler)
        runs.append({"run": run_i + 1, "rss_mb_settled": round(rss / 2**20, 1), "kv_cache_mb": round(kv / 2**20, 1),
                     "rss_mb_besides_kv_cache": round((rss - kv) / 2**20, 1)})
    rows = []
    budget = getattr(getattr(engine, "prefix_cache", None), "budget_bytes", None)
    for n in levels:
        results = [r for rs, _ in by_level[n] for r in rs]
        row = level_row(n, results, sum(w for _, w in by_level[n]))
        row.update(cache_figures(cache[n], kv_peak[n] if cache[n] is not None else None, budget),
                   **reuse_figures(results, pool))
        pauses = [r.think_s for r in results if r.think_s is not None]
        row["think_time_s_mean"] = round(sum(pauses) / len(pauses), 2) if pauses else None
        rows.append(row)
    totals = {k: sum(row[k] for row in rows) for k in ("requests", *COMPLETE, "cancelled", "429", "4xx", *BAD)}
    mine = sampler.samples[first_sample:]
    kv_max = max((s[2] for s in mine), default=0)
    rss = [s[1] for s in mine if s[0].startswith("run")]
    def growth(key):  # last run vs first: a leak grows every run; the KV cache grows only up to its budget
        return round(runs[-1][key] - runs[0][key], 1) if len(runs) > 1 else None

    return {"rows": rows, "totals": totals, "stuck_workers": stuck_workers, "server_5xx": int(server_errors),
            "runs": runs,
            "rss_mb_peak": round(max(rss) / 2**20, 1) if rss else None,
            "rss_growth_mb": growth("rss_mb_settled"),
            "rss_growth_besides_kv_cache_mb": growth("rss_mb_besides_kv_cache"),
            "memory_ok": len(runs) < 2 or growth("rss_mb_besides_kv_cache") < MEMORY_GROWTH_LIMIT_MB,
            "kv_bytes_max": kv_max, "kv_budget_bytes": budget,
            "kv_within_budget": budget is None or kv_max <= budget,
            "prefix_cache": engine.prefix_cache.stats() if hasattr(engine, "prefix_cache") else None}
