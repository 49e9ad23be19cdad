"""Load: N concurrent streaming clients through the API on loopback, at concurrency 1, 2, 4, 8, 16.

The model is served by our API on a free 127.0.0.1 port in this process; clients are httpx
streams on their own event loop. Each client plays two-turn conversations from a fixed pool with
mixed toggles: KV reuse on/off, with and without a session (`POST /v1/sessions`), greedy and
seeded sampling, and the speculative and quantization settings the engine offers (probed: a
toggle the engine ignores is not counted as offered). Some requests disconnect midway.

Checks (each request): a completed reply must equal what the same request gave alone, computed
first, in-process, one at a time, without a session; a cancelled one must be a prefix of it.
A reply equal to another request's reference is *crossed*; one equal to none is *mismatched* where
the engine promises exact replies (fp32), else *differs* (counted, not a failure);
a stream that ends without its finish chunk is *lost*; one past its deadline is *stuck*; any 5xx
(status, or a server_error inside a stream) is counted. After each level the worker must be idle
(nothing left queued or running). Process memory (psutil RSS) and the prefix cache's bytes are
sampled all along; the whole load runs twice (`--repeat`) and the RSS after each run is compared.

Figures per level (server `timings`, the glossary's): p50/p90/p99 of `queue_ms`, `ttft_ms`,
`tpot_ms`, `e2e_ms`; throughput in completed requests/s and output tok/s over the level's wall
time. fp32 by default: greedy output with KV reuse equals output without only in fp32 (README,
"Exactness"); in bf16 a reused prefix can change a near-tie and would show as a mismatch.

Here: the flags and the scenario (one engine, or several max batches side by side). The clients
and the run loop: load_drive.py; the figures: load_figures.py; the pool and the judge: load_pool.py.
"""

from __future__ import annotations

import time

from engine.bench import load_model

from .load_drive import MemorySampler, run_load
from .load_figures import BAD, compare_rows, compare_table, merge_rows, table, trade_off
from .load_pool import build_pool, compute_references, offered_toggles

LEVELS = (1, 2, 4, 8, 16)


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

    from engine.serving.prefix_cache import PrefixCache
    from engine.serving.service import Engine
    from server.api import create_api
    from server.run import BackgroundServer

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
                "requests ({exact} exact, {differs} differing where exactness is not promised, {cancelled} cancelled "
                "on purpose)".format(**totals)
                + f"; worker left busy {stuck} times")
            by_batch[mb] = {"rows": rows, "totals": totals, "stuck_workers": stuck, "server_5xx": s5xx,
                            "kv_within_budget": all(r["kv_within_budget"] for r in runs),
                            "max_batch": mb, "batching": engine.info().batching, "offers": offers,
                            "reference_texts": refs, "ok": bad == 0 and all(r["kv_within_budget"] for r in runs)}
    return by_batch


def run_one(loaded, args, levels, max_batch: int, out):
    """The whole load against one engine (max batch `max_batch`) over the loaded model."""
    from engine.serving.prefix_cache import PrefixCache
    from engine.serving.service import Engine
    from server.api import create_api
    from server.run import BackgroundServer

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
    out("lost {lost}, crossed {crossed}, mismatched {mismatched}, stuck {stuck}, 5xx {5xx} of {requests} requests "
        "({exact} exact, {differs} differing where exactness is not promised, {cancelled} cancelled on purpose)".format(**t)
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
