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
time. fp32 by default: greedy output with KV reuse equals output without only in fp32 (docs/engine.md,
"Exactness"); in bf16 a reused prefix can change a near-tie and would show as a mismatch.

KV reuse under load (`--turns`, `--think-time`, `--think-dist`, `--kv-budgets`, `--reuse-only`;
server/load/reuse.py): conversations of N turns with user think time between them, every level once
per prefix-cache budget; per level the cache's hit rate and evictions and follow-up turns' TTFT
against first turns', and one sentence naming the load or budget at which reuse collapses.

Here: the flags, and the figures printed. The load itself (pool and judge, clients, the run loop,
the engines it serves, the figures): the server/load package, which the page's Load tab runs too.
"""

from __future__ import annotations

from dataclasses import fields

from engine.bench import load_model
from engine.cli import comma_list
from server.bench import load_open
from server.load.figures import (
    compare_rows,
    compare_table,
    table,
    totals_line,
    trade_off,
)
from server.load.reuse import DISTRIBUTIONS, ThinkTime, collapse_sentence, reuse_table
from server.load.scenario import LoadSettings, run_one, run_side_by_side

LEVELS = (1, 2, 4, 8, 16)
CLOSED_DURATION_S = 20.0


def add_args(p):
    p.set_defaults(dtype="fp32")  # exactness is checked: see the module docstring
    p.add_argument("--levels", default=",".join(map(str, LEVELS)), type=comma_list(int, 1),
                   help="concurrency levels (clients)")
    p.add_argument("--duration", type=float, default=None,
                   help=f"seconds each level keeps sending (closed loop: default {CLOSED_DURATION_S:g}; open loop: "
                        "instead of --num-prompts)")
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
    p.add_argument("--compare-max-batch", default=None, metavar="N,M", type=comma_list(int, 1),
                   help="run the whole load once per --max-batch value, side by side in this process "
                        "(e.g. 1,8), and print the throughput/latency trade-off between them")
    g = p.add_argument_group("KV reuse under load (closed loop; server/load/reuse.py)")
    g.add_argument("--turns", type=int, default=2, help="turns per conversation (each follow-up extends its history)")
    g.add_argument("--think-time", type=float, default=0.0, metavar="S",
                   help="mean seconds a client thinks between a reply and its conversation's next turn")
    g.add_argument("--think-dist", choices=DISTRIBUTIONS, default="exponential",
                   help="how think times spread around their mean (seeded by --seed)")
    g.add_argument("--kv-budgets", default=None, metavar="MB,MB", type=comma_list(float, 0),
                   help="run every level once per prefix-cache budget in MiB (e.g. 4,16,64); default: --kv-cache-mb")
    g.add_argument("--reuse-only", action="store_true",
                   help="every conversation greedy with KV reuse in a session (no toggle mix): the reuse study's pool")
    load_open.add_args(p)


# --- the scenario ------------------------------------------------------------------------------------
def run(args, out):
    """The load at `--max-batch`, or at every value of `--compare-max-batch` side by side: one
    loaded model, one engine and API per value, the levels alternating between the engines.
    With --request-rate: open loop instead (load_open.py)."""
    if args.request_rate:
        return load_open.run(args, out)
    if args.duration is None:
        args.duration = CLOSED_DURATION_S
    levels = args.levels
    settings = load_settings(args)
    if not args.compare_max_batch:
        result = run_one(load_model(args), settings, levels, args.max_batch, out)
        print_one(result, out)
        if reuse_study(args):
            out(reuse_table(result["rows"]))
            result["reuse_sentence"] = collapse_sentence(result["rows"])
            out(result["reuse_sentence"])
        return result
    if settings.kv_budgets:
        raise SystemExit("--kv-budgets and --compare-max-batch each run the whole load several times: give one")
    batches = args.compare_max_batch
    by_batch = run_side_by_side(load_model(args), settings, levels, batches, out)
    for mb, r in by_batch.items():
        out(f"max batch {mb}:")
        out(table(r["rows"]))
        out(totals_line(r["totals"]) + f"; worker left busy {r['stuck_workers']} times")
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


def load_settings(args) -> LoadSettings:
    """The flags → LoadSettings; a bad knob is a clear error, not a traceback."""
    given = {f.name: getattr(args, f.name) for f in fields(LoadSettings) if hasattr(args, f.name)}
    try:
        budgets = tuple(args.kv_budgets or ())
        think = ThinkTime(args.think_time, args.think_dist, args.seed) if args.think_time else None
    except ValueError as exc:
        raise SystemExit(f"--kv-budgets / --think-time: {exc}") from None
    if args.turns < 1 or any(b < 0 for b in budgets):
        raise SystemExit("--turns must be at least 1 and --kv-budgets at least 0 MiB each")
    return LoadSettings(**{**given, "think": think, "kv_budgets": budgets})


def reuse_study(args) -> bool:
    return bool(args.kv_budgets or args.think_time or args.turns > 2 or args.reuse_only)


def print_one(result: dict, out) -> None:
    """One engine's load: its table (one per KV budget), the judge's totals, memory run over run."""
    budgets = list(dict.fromkeys(r.get("kv_budget_mb") for r in result["rows"]))
    for mb in budgets:
        if len(budgets) > 1:
            out(f"KV budget {mb:g} MiB:")
        out(table([r for r in result["rows"] if r.get("kv_budget_mb") == mb]))
    out(totals_line(result["totals"]) + f"; 5xx counted by the server {result['server_5xx']}; worker left busy "
        f"{result['stuck_workers']} times")
    out(f"memory: RSS settled per run {[r['rss_mb_settled'] for r in result['runs']]} MiB (growth "
        f"{result['rss_growth_mb']} MiB; besides the KV cache {result['rss_growth_besides_kv_cache_mb']} MiB), "
        f"peak {result['rss_mb_peak']} MiB; KV cache max "
        f"{result['kv_bytes_max'] / 2**20:.1f} of {result['kv_budget_bytes'] / 2**20:.0f} MiB")
