"""Running the load: the clients that drive the API, the memory sampler, and `run_load` (every
level, `repeat` times, with the checks after each level). The scenario: server/bench/load.py.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

from .load_clients import drive_elsewhere
from .load_figures import BAD, COMPLETE, level_row
from .load_pool import Result, ScriptedConversation, judge, one_request

# RSS besides the KV cache may grow this much from the first run to the last (allocator noise was
# 1-4 MiB a run here); a leak of each request's KV (~3 MB fp32 x ~20 requests a run) is far more.
MEMORY_GROWTH_LIMIT_MB = 32


async def drive(url: str, pool: list[ScriptedConversation], clients: int, duration: float, max_requests: int,
                cancel_every: int, deadline: float, api_key: str | None = None, headers: dict | None = None,
                on_result=None) -> tuple[list[Result], float]:
    """`clients` clients play conversations until `duration` is up (then finish what they sent).
    `headers`: sent with every request (the page forwards its own auth); `on_result(result)`: called
    as each request is judged (the page's live plots)."""
    import httpx

    references = {t.key: t.ref_text for c in pool for t in c.turns}
    results: list[Result] = []
    sent = 0
    headers = {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **(headers or {})}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(deadline + 30, connect=10), limits=limits,
                                 headers=headers) as http:
        t0 = time.perf_counter()
        end = t0 + duration

        async def client(c: int) -> None:
            nonlocal sent
            i = 0
            while time.perf_counter() < end and sent < max_requests:
                conv = pool[(c + i * clients) % len(pool)]
                i += 1
                session = None
                if conv.with_session:
                    resp = await http.post(url + "/v1/sessions")
                    session = resp.json()["id"]
                for turn in conv.turns:
                    if sent >= max_requests:
                        return
                    sent += 1
                    cancel = None
                    if cancel_every and sent % cancel_every == 0:
                        cancel = "queued" if (sent // cancel_every) % 2 else "midway"
                    r = await one_request(http, url, turn, session, cancel, deadline, clients)
                    r.outcome = judge(r, turn, references)
                    results.append(r)
                    if on_result is not None:
                        on_result(r)

        await asyncio.gather(*(client(c) for c in range(clients)))
        return results, time.perf_counter() - t0


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
    clients run in a process of their own (load_clients.py), as real clients do."""
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
