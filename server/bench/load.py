"""Load: N concurrent streaming clients through the API on loopback, at concurrency 1, 2, 4, 8, 16.

The model is served by our API on a free 127.0.0.1 port in this process; clients are httpx
streams on their own event loop. Each client plays two-turn conversations from a fixed pool with
mixed toggles: KV reuse on/off, with and without a session (`POST /v1/sessions`), greedy and
seeded sampling, and the speculative and quantization settings the engine offers (probed: a
toggle the engine ignores is not counted as offered). Some requests disconnect midway.

Checks (each request): a completed reply must equal what the same request gave alone, computed
first, in-process, one at a time, without a session; a cancelled one must be a prefix of it.
A reply equal to another request's reference is *crossed*; one equal to none is *mismatched*;
a stream that ends without its finish chunk is *lost*; one past its deadline is *stuck*; any 5xx
(status, or a server_error inside a stream) is counted. After each level the worker must be idle
(nothing left queued or running). Process memory (psutil RSS) and the prefix cache's bytes are
sampled all along; the whole load runs twice (`--repeat`) and the RSS after each run is compared.

Figures per level (server `timings`, the glossary's): p50/p90/p99 of `queue_ms`, `ttft_ms`,
`tpot_ms`, `e2e_ms`; throughput in completed requests/s and output tok/s over the level's wall
time. fp32 by default: greedy output with KV reuse equals output without only in fp32 (README,
"Exactness"); in bf16 a reused prefix can change a near-tie and would show as a mismatch.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np

from engine.bench import load_model

from .load_pool import (Result, ScriptedConversation, build_pool, compute_references, judge,
                        offered_toggles, one_request)

LEVELS = (1, 2, 4, 8, 16)
METRICS = ("queue_ms", "ttft_ms", "tpot_ms", "e2e_ms")
BAD = ("lost", "crossed", "mismatched", "stuck", "5xx")
# RSS besides the KV cache may grow this much from the first run to the last (allocator noise was
# 1-4 MiB a run here); a leak of each request's KV (~3 MB fp32 x ~20 requests a run) is far more.
MEMORY_GROWTH_LIMIT_MB = 32


def add_args(p):
    p.set_defaults(dtype="fp32")  # exactness is checked: see the module docstring
    p.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels (clients)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds each level keeps sending")
    p.add_argument("--max-requests", type=int, default=200, help="at most this many requests per level")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--conversations", type=int, default=8, help="two-turn conversations in the pool")
    p.add_argument("--cancel-every", type=int, default=6, help="every Nth request disconnects (0: none)")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds a request may take before it is stuck")
    p.add_argument("--repeat", type=int, default=2, help="run the whole load this many times (memory run over run)")
    p.add_argument("--max-queue", type=int, default=None, help="the worker's queue bound (default: none)")
    p.add_argument("--mix-quantization", default="auto",
                   help="the variant some requests of the mix ask for: auto (one the engine offers), a name, or none")
    p.add_argument("--mix-speculative", default="auto", choices=("auto", "none"),
                   help="auto: some requests of the mix speculate when the engine offers it; none: no speculation "
                        "(with --max-batch > 1 speculative requests run unbatched beside the batch)")
    p.add_argument("--compare-max-batch", default=None, metavar="N,M",
                   help="run the whole load once per --max-batch value, side by side in this process "
                        "(e.g. 1,8), and print the throughput/latency trade-off between them")


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


# --- figures -------------------------------------------------------------------------------------
def percentiles(values) -> dict:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": round(float(np.percentile(xs, q)), 2) for q in (50, 90, 99)}


def level_row(clients: int, results: list[Result], wall_s: float) -> dict:
    done = [r for r in results if r.outcome == "exact"]
    counts = {k: sum(r.outcome == k for r in results) for k in ("exact", "cancelled", "429", "4xx", *BAD)}
    out_tokens = sum((r.timings or {}).get("output_tokens", 0) for r in done)
    row = {"clients": clients, "requests": len(results), **counts, "wall_s": round(wall_s, 2),
           "req_per_s": round(len(done) / wall_s, 3) if wall_s else None,
           "output_tok_per_s": round(out_tokens / wall_s, 2) if wall_s else None}
    for m in METRICS:
        for q, v in percentiles([(r.timings or {}).get(m) for r in done]).items():
            row[f"{m}_{q}"] = v
    row["client_ttft_ms_p50"] = percentiles([r.client_ttft_ms for r in done])["p50"]
    sizes = [b for r in done for b in (r.timings or {}).get("batch_size") or []]
    row["batch_size_mean"] = round(float(np.mean(sizes)), 2) if sizes else 1.0  # tokens' forwards, all requests
    return row


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
    """Every level, `repeat` times; rows per level (all runs pooled), counts, memory run over run."""
    by_level: dict[int, list[tuple[list[Result], float]]] = {n: [] for n in levels}
    runs, stuck_workers, server_errors = [], 0, 0
    for run_i in range(repeat):
        sampler.phase = f"run{run_i + 1}"
        for n in levels:
            errors_before = server_5xx(url)
            results, wall = asyncio.run(drive(url, pool, n, duration, max_requests, cancel_every, deadline,
                                              api_key))
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
    totals = {k: sum(row[k] for row in rows) for k in ("requests", "exact", "cancelled", "429", "4xx", *BAD)}
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


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows (what the README shows)."""
    head = ["clients", "requests", "req/s", "tok/s"] + [f"{m} p50/p90/p99" for m in METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["clients"], r["requests"], r["req_per_s"], r["output_tok_per_s"]] + [
            " / ".join("-" if r[f"{m}_{q}"] is None else f"{r[f'{m}_{q}']:,.0f}" for q in ("p50", "p90", "p99"))
            for m in METRICS]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


# --- the scenario ------------------------------------------------------------------------------------
def run(args, out):
    """The load at `--max-batch`, or at every value of `--compare-max-batch` side by side: one
    loaded model, one engine and API per value, the levels alternating between the engines (this
    machine is shared and noisy: a comparison of runs minutes apart would measure the neighbours)."""
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    if not args.compare_max_batch:
        return run_one(load_model(args), args, levels, args.max_batch, out)
    batches = [int(x) for x in args.compare_max_batch.split(",") if x.strip()]
    by_batch = run_side_by_side(load_model(args), args, levels, batches, out)
    base, best = by_batch[batches[0]], by_batch[batches[-1]]
    rows = compare_rows(levels, base["rows"], best["rows"])
    out(f"max batch {batches[0]} vs {batches[-1]}:")
    out(compare_table(rows, batches[0], batches[-1]))
    sentence = trade_off(rows, batches[0], batches[-1])
    out(sentence)
    same_refs = sum(a == b for a, b in zip(base["reference_texts"], best["reference_texts"]))
    out(f"references (each request alone) equal between the two engines: {same_refs} of {len(base['reference_texts'])}")
    return {"levels": levels, "max_batches": batches, "by_max_batch": {str(k): v for k, v in by_batch.items()},
            "comparison": rows, "trade_off": sentence, "references_equal": same_refs,
            "ok": all(v["ok"] for v in by_batch.values()), "ratio": rows[-1]["tok_per_s_ratio"]}


def run_side_by_side(loaded, args, levels, batches, out) -> dict:
    """One engine + API per max batch over `loaded`; each level runs on every engine in turn."""
    import contextlib

    from server.api import create_api
    from server.run import BackgroundServer

    from engine.prefix_cache import PrefixCache
    from engine.service import Engine

    with contextlib.ExitStack() as stack:
        setups = {}
        for mb in batches:
            engine = Engine(loaded, max_queue=args.max_queue, max_batch=mb,
                            prefix_cache=PrefixCache(args.kv_cache_mb, shared=args.shared_prefix_cache))
            stack.callback(engine.close)
            sampler = stack.enter_context(MemorySampler(engine.prefix_cache))
            url = stack.enter_context(BackgroundServer(create_api(engine)))
            offers = offered_toggles(engine, variants=args.mix_quantization)
            if getattr(args, "mix_speculative", "auto") == "none":
                offers["speculative"] = None
            pool = build_pool(args.conversations, args.max_new_tokens, offers)
            t0 = time.perf_counter()
            compute_references(engine, pool)
            refs = [t.ref_text for c in pool for t in c.turns]
            out(f"max batch {mb}: references in {time.perf_counter() - t0:.1f} s "
                f"({len(set(refs))} distinct of {len(refs)}); offered: {offers}")
            setups[mb] = (engine, url, pool, sampler, refs, offers)
        parts = {mb: [] for mb in batches}
        for _ in range(args.repeat):
            for n in levels:
                for mb in batches:
                    engine, url, pool, sampler, _, _ = setups[mb]
                    parts[mb].append(run_load(engine, url, pool, (n,), duration=args.duration,
                                              max_requests=args.max_requests, cancel_every=args.cancel_every,
                                              deadline=args.deadline, repeat=1, sampler=sampler,
                                              out=lambda line, mb=mb: out(f"max batch {mb}, {line}")))
        by_batch = {}
        for mb in batches:
            engine, _, _, _, refs, offers = setups[mb]
            runs = parts[mb]
            rows = [merge_rows([r["rows"][0] for r in runs if r["rows"][0]["clients"] == n]) for n in levels]
            totals = {k: sum(r["totals"][k] for r in runs) for k in runs[0]["totals"]}
            stuck, s5xx = sum(r["stuck_workers"] for r in runs), sum(r["server_5xx"] for r in runs)
            bad = sum(totals[k] for k in BAD) + totals["4xx"] + stuck + s5xx + (
                totals["429"] if args.max_queue is None else 0)
            out(f"max batch {mb}:")
            out(table(rows))
            out("lost {lost}, crossed {crossed}, mismatched {mismatched}, stuck {stuck}, 5xx {5xx} of {requests} "
                "requests ({exact} exact, {cancelled} cancelled on purpose)".format(**totals)
                + f"; worker left busy {stuck} times")
            by_batch[mb] = {"rows": rows, "totals": totals, "stuck_workers": stuck, "server_5xx": s5xx,
                            "kv_within_budget": all(r["kv_within_budget"] for r in runs),
                            "max_batch": mb, "batching": engine.info().batching, "offers": offers,
                            "reference_texts": refs, "ok": bad == 0 and all(r["kv_within_budget"] for r in runs)}
    return by_batch


def merge_rows(rows: list[dict]) -> dict:
    """Repeats of one level: counts and wall time add up; percentiles are those of the first run
    when there is one, else a median of the runs' (good enough for --repeat 2 on a shared machine)."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    for k in ("requests", "exact", "cancelled", "429", "4xx", *BAD):
        out[k] = sum(r[k] for r in rows)
    out["wall_s"] = round(sum(r["wall_s"] for r in rows), 2)
    for k, v in rows[0].items():
        if k.endswith(("_p50", "_p90", "_p99", "_per_s")) or k == "batch_size_mean":
            xs = [r[k] for r in rows if r.get(k) is not None]
            out[k] = float(np.median(xs)) if xs else None
    return out


def compare_rows(levels, base_rows, rows) -> list[dict]:
    """Per clients level: throughput and latency of the second run against the first (ratios b/a)."""
    def ratio(a, b):
        return round(b / a, 2) if a and b is not None else None

    out = []
    for n, a, b in zip(levels, base_rows, rows):
        row = {"clients": n}
        for key, name in (("output_tok_per_s", "tok_per_s"), ("req_per_s", "req_per_s"), ("ttft_ms_p50", "ttft_p50"),
                          ("tpot_ms_p50", "tpot_p50"), ("queue_ms_p50", "queue_p50"), ("e2e_ms_p50", "e2e_p50"),
                          ("batch_size_mean", "batch_size_mean")):
            row[f"{name}_a"], row[f"{name}_b"] = a.get(key), b.get(key)
            row[f"{name}_ratio"] = ratio(a.get(key), b.get(key))
        out.append(row)
    return out


def compare_table(rows: list[dict], a: int, b: int) -> str:
    cols = [("tok_per_s", "output tok/s"), ("req_per_s", "req/s"), ("ttft_p50", "TTFT p50 ms"),
            ("tpot_p50", "TPOT p50 ms"), ("queue_p50", "queue p50 ms"), ("batch_size_mean", "mean batch")]
    head = ["clients"] + [f"{label} ({a} → {b}, ×)" for _, label in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v):
        return "-" if v is None else f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"

    for r in rows:
        cells = [str(r["clients"])] + [f"{f(r[k + '_a'])} → {f(r[k + '_b'])} ({f(r[k + '_ratio'])}×)" for k, _ in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def trade_off(rows: list[dict], a: int, b: int) -> str:
    """One sentence: what batching bought at the busiest level and what it cost a lone client."""
    top, low = rows[-1], rows[0]
    parts = [f"At {top['clients']} clients max batch {b} served {f_(top['tok_per_s_b'])} output tok/s against "
             f"{f_(top['tok_per_s_a'])} ({f_(top['tok_per_s_ratio'])}×) with p50 TTFT {f_(top['ttft_p50_b'])} ms "
             f"against {f_(top['ttft_p50_a'])} ms"]
    if low is not top:
        parts.append(f"at {low['clients']} client(s) p50 TPOT was {f_(low['tpot_p50_b'])} ms against "
                     f"{f_(low['tpot_p50_a'])} ms ({f_(low['tpot_p50_ratio'])}×)")
    parts.append(f"each step of a batch is slower (p50 TPOT at {top['clients']} clients {f_(top['tpot_p50_b'])} ms "
                 f"against {f_(top['tpot_p50_a'])} ms alone) but serves up to {b} requests at once")
    return "; ".join(parts) + "."


def f_(v) -> str:
    return "n/a" if v is None else f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}"


def run_one(loaded, args, levels, max_batch: int, out):
    """The whole load against one engine (max batch `max_batch`) over the loaded model."""
    from server.api import create_api
    from server.run import BackgroundServer

    from engine.prefix_cache import PrefixCache
    from engine.service import Engine

    engine = Engine(loaded, max_queue=args.max_queue, max_batch=max_batch,
                    prefix_cache=PrefixCache(args.kv_cache_mb, shared=args.shared_prefix_cache))
    try:
        with MemorySampler(engine.prefix_cache) as sampler, BackgroundServer(create_api(engine)) as url:
            offers = offered_toggles(engine, variants=args.mix_quantization)
            if getattr(args, "mix_speculative", "auto") == "none":
                offers["speculative"] = None
            pool = build_pool(args.conversations, args.max_new_tokens, offers)
            sampler.phase = "references"
            t0 = time.perf_counter()
            compute_references(engine, pool)
            refs = [t.ref_text for c in pool for t in c.turns]
            out(f"{engine.info().name} ({engine.info().dtype}) on {url}: {len(pool)} conversations, "
                f"references in {time.perf_counter() - t0:.1f} s ({len(set(refs))} distinct of {len(refs)}); "
                f"offered: {offers}")
            result = run_load(engine, url, pool, levels, duration=args.duration, max_requests=args.max_requests,
                              cancel_every=args.cancel_every, deadline=args.deadline, repeat=args.repeat,
                              sampler=sampler, out=out)
    finally:
        engine.close()
    out(table(result["rows"]))
    t = result["totals"]
    out("lost {lost}, crossed {crossed}, mismatched {mismatched}, stuck {stuck}, 5xx {5xx} "
        "of {requests} requests ({exact} exact, {cancelled} cancelled on purpose)".format(**t)
        + f"; 5xx counted by the server {result['server_5xx']}; worker left busy {result['stuck_workers']} times")
    out(f"memory: RSS settled per run {[r['rss_mb_settled'] for r in result['runs']]} MiB (growth "
        f"{result['rss_growth_mb']} MiB; besides the KV cache {result['rss_growth_besides_kv_cache_mb']} MiB), "
        f"peak {result['rss_mb_peak']} MiB; KV cache max "
        f"{result['kv_bytes_max'] / 2**20:.1f} of {result['kv_budget_bytes'] / 2**20:.0f} MiB")
    bad = (sum(t[k] for k in BAD) + t["4xx"] + result["stuck_workers"] + result["server_5xx"]
           + (t["429"] if args.max_queue is None else 0))
    return {**result, "offers": offers, "levels": levels, "dtype": engine.info().dtype, "max_batch": max_batch,
            "batching": engine.info().batching, "reference_texts": refs,
            "distinct_references": len(set(refs)), "references": len(refs),
            "ok": bad == 0 and result["kv_within_budget"] and result["memory_ok"],
            "ratio": None}
