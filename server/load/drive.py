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
             api_key: str | None = None) -> dict:
    """Every level, `repeat` times; rows per level (all runs pooled), counts, memory run over run. The
    clients run in a process of their own (clients.py), as real clients do."""
    by_level: dict[int, list[tuple[list[Result], float]]] = {n: [] for n in levels}
    runs, stuck_workers, server_errors = [], 0, 0
    for run_i in range(repeat):
        sampler.phase = f"run{run_i + 1}"
        for n in levels:
            errors_before = server_5xx(url)
            results, wall = drive_elsewhere(url, pool, n, duration, max_requests, cancel_every, deadline, api_key)
            if not wait_idle(engine):
                stuck_workers += 1
            server_errors += server_5xx(url) - errors_before
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
    for n in levels:
        results = [r for rs, _ in by_level[n] for r in rs]
        rows.append(level_row(n, results, sum(w for _, w in by_level[n])))
    totals = {k: sum(row[k] for row in rows) for k in ("requests", *COMPLETE, "cancelled", "429", "4xx", *BAD)}
    budget = getattr(getattr(engine, "prefix_cache", None), "budget_bytes", None)
    kv_max = max((s[2] for s in sampler.samples), default=0)
    rss = [s[1] for s in sampler.samples if s[0].startswith("run")]
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
