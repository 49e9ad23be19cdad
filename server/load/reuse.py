"""KV reuse under load: conversations of N turns with user think time between them, and the prefix
cache's budget as a knob of the run. Per load level: the prefix cache's hit rate and evictions,
follow-up turns' TTFT against first turns', and one sentence naming the load or budget at which
reuse collapses: where the live conversations' KV no longer fits the budget, LRU evicts a
conversation while its user thinks, and its next turn prefills the whole history again.

`ThinkTime`: the gap a client leaves between a reply's end and its conversation's next turn, drawn
per turn (numpy's seeded Generator: the same seed, the same gaps). AIPerf and vLLM's multi-turn
bench draw such delays too; the distributions here:
- `constant`: exactly the mean;
- `exponential`: memoryless, most gaps short, a few long (the mean's standard deviation);
- `uniform`: between 0 and twice the mean;
- `lognormal`: σ = 1 around the mean (human response times are roughly log-normal: a long right tail).

`kv_budget(engine, mb)`: the engine's prefix cache at that budget for the run, then back as it was
(other users' chats share the cache meanwhile, as they share the batch). `reuse_figures(results,
pool)` reads each reply's own `timings` (so it works for any server that reports cached tokens):
a follow-up turn *reused its history* when its cached tokens cover the previous turn's prompt (all but
its last token: BOUNDARY_TOKENS).
`cache_figures` adds the server's own counts where the engine is in this process.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from .figures import COMPLETE, f_, percentiles

DISTRIBUTIONS = ("constant", "exponential", "uniform", "lognormal")
LOGNORMAL_SIGMA = 1.0
COLLAPSED = 0.5  # reuse has collapsed at a level whose history-reuse rate is below half the run's best
# A follow-up "reused its history" when its cached tokens cover the previous turn's prompt but for its last
# token: re-rendered with the reply after it, the template's "assistant\n" may merge with the reply's first
# characters (a reply that starts with a newline does, in SmolLM2's tokenizer), so that token differs.
BOUNDARY_TOKENS = 1


@dataclass(frozen=True)
class ThinkTime:
    mean_s: float
    dist: str = "exponential"
    seed: int = 0

    def __post_init__(self):
        if not (self.mean_s >= 0 and math.isfinite(self.mean_s)):
            raise ValueError("think time must be a number of seconds >= 0")
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"think time distribution must be one of {', '.join(DISTRIBUTIONS)}")

    def rng(self, client: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, client])  # each client its own stream, reproducible

    def draw(self, rng: np.random.Generator) -> float:
        m = self.mean_s
        if m == 0 or self.dist == "constant":
            return m
        if self.dist == "exponential":
            return float(rng.exponential(m))
        if self.dist == "uniform":
            return float(rng.uniform(0, 2 * m))
        return float(rng.lognormal(math.log(m) - LOGNORMAL_SIGMA**2 / 2, LOGNORMAL_SIGMA))

    def to_dict(self) -> dict:
        return {"mean_s": self.mean_s, "dist": self.dist, "seed": self.seed}


@contextlib.contextmanager
def kv_budget(engine, mb: float | None):
    """The engine's prefix cache at `mb` MiB for the block (None, or an engine without one: as it is)."""
    cache = getattr(engine, "prefix_cache", None)
    if mb is None or cache is None:
        yield
        return
    old_mb, old_source = cache.set_budget(mb, f"a load run's KV budget ({mb:g} MiB)")
    try:
        yield
    finally:
        cache.set_budget(old_mb, old_source)


CACHE_COUNTS = ("lookups", "hits", "query_tokens", "hit_tokens", "evictions", "rejected", "handovers")


def cache_counts(engine) -> dict | None:
    cache = getattr(engine, "prefix_cache", None)
    return {k: cache.stats()[k] for k in CACHE_COUNTS} if cache is not None else None


def counts_diff(before: dict | None, after: dict | None, into: dict | None = None) -> dict | None:
    """The cache's counts over one level (`after - before`), added to `into` (several runs of a level)."""
    if before is None or after is None:
        return into
    into = into or dict.fromkeys(CACHE_COUNTS, 0)
    return {k: into[k] + after[k] - before[k] for k in CACHE_COUNTS}


def cache_figures(d: dict | None, kv_peak_bytes: int | None, budget_bytes: int | None) -> dict:
    """A level's prefix-cache figures from its counts (`counts_diff`): token hit rate, evictions,
    refusals; its peak bytes and its budget (None where the engine is not in this process)."""
    if d is None:
        return {"prefix_hit_rate": None, "kv_evictions": None, "kv_rejected": None, "kv_peak_mb": None,
                "kv_budget_mb": None}
    return {"prefix_hit_rate": round(d["hit_tokens"] / d["query_tokens"], 3) if d["query_tokens"] else None,
            "kv_evictions": d["evictions"], "kv_rejected": d["rejected"],
            "kv_peak_mb": _mib(kv_peak_bytes), "kv_budget_mb": _mib(budget_bytes)}


def _mib(n: int | None) -> float | None:
    return None if n is None else float(f"{n / 2**20:.3g}")


def reuse_figures(results, pool) -> dict:
    """Follow-up turns against first turns, over the conversations that can reuse (KV reuse on, in a
    session): p50 server TTFT of each, their ratio, p50 prefill tokens, and the share of follow-ups
    whose cached tokens cover the previous turn's prompt (`follow_up_reuse_rate`; see BOUNDARY_TOKENS)."""
    turns = {t.key: (conv, i) for conv in pool for i, t in enumerate(conv.turns)}
    first, follow, prefilled, reused = [], [], [], []
    for r in results:
        if r.outcome not in COMPLETE or r.key not in turns:
            continue
        conv, i = turns[r.key]
        if not conv.with_session or not conv.turns[i].body.get("kv_reuse", True):
            continue
        t = r.timings or {}
        (follow if i else first).append(t.get("ttft_ms"))
        if i:
            prefilled.append(t.get("prefill_tokens"))
            cached, previous = t.get("cached_tokens"), conv.turns[i - 1].ref_prompt_tokens
            if cached is not None and previous:
                reused.append(cached >= previous - BOUNDARY_TOKENS)
    a, b = percentiles(first)["p50"], percentiles(follow)["p50"]
    return {"first_turn_ttft_ms_p50": a, "follow_up_ttft_ms_p50": b,
            "follow_up_ttft_ratio": round(b / a, 2) if a and b is not None else None,
            "follow_up_prefill_tokens_p50": percentiles(prefilled)["p50"],
            "follow_ups": len(follow), "follow_up_reuse_rate": round(sum(reused) / len(reused), 3) if reused else None}


def reuse_table(rows: list[dict]) -> str:
    head = ["KV budget MiB", "clients", "follow-ups", "history reused", "prefix hit rate", "evicted / refused",
            "TTFT p50 first → follow-up ms (×)", "follow-up prefill tok p50", "KV peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pct(v):
        return "-" if v is None else f"{100 * v:.0f}%"

    for r in rows:
        lines.append("| " + " | ".join(map(str, [
            _mb(r.get("kv_budget_mb")), r["clients"], r.get("follow_ups"), pct(r.get("follow_up_reuse_rate")),
            pct(r.get("prefix_hit_rate")), f"{_dash(r.get('kv_evictions'))} / {_dash(r.get('kv_rejected'))}",
            f"{f_(r.get('first_turn_ttft_ms_p50'))} → {f_(r.get('follow_up_ttft_ms_p50'))} "
            f"({f_(r.get('follow_up_ttft_ratio'))}×)", _dash(r.get("follow_up_prefill_tokens_p50")),
            _dash(r.get("kv_peak_mb"))])) + " |")
    return "\n".join(lines)


def collapse_sentence(rows: list[dict]) -> str:
    """One sentence: per KV budget, the lightest load at which follow-up turns stopped reusing their
    history (rate below COLLAPSED × the run's best), or that reuse held at every load measured."""
    rated = [r for r in rows if r.get("follow_up_reuse_rate") is not None]
    if not rated:
        return "No follow-up turn reported cached tokens: reuse cannot be judged (the server does not report them)."
    best = max(r["follow_up_reuse_rate"] for r in rated)
    if best == 0:
        return "No follow-up turn reused its history at any load or budget measured."
    budgets = list(dict.fromkeys(r.get("kv_budget_mb") for r in rated))
    parts = []
    for mb in budgets:
        mine = sorted((r for r in rated if r.get("kv_budget_mb") == mb), key=lambda r: r["clients"])
        where = f"with a {_mb(mb)} MiB KV budget" if mb is not None else "with the engine's KV budget"
        fell = next((r for r in mine if r["follow_up_reuse_rate"] < COLLAPSED * best), None)
        if fell is None:
            low, high = _pct(min(r["follow_up_reuse_rate"] for r in mine)), _pct(best_of(mine))
            parts.append(f"{where} reuse held up to {mine[-1]['clients']} clients (follow-ups reused their history "
                         f"{low if low == high else f'{low}–{high}'} of the time)")
            continue
        before = [r for r in mine if r["clients"] < fell["clients"]]
        held = f", against {_pct(before[-1]['follow_up_reuse_rate'])} at {before[-1]['clients']}" if before else ""
        parts.append(f"{where} reuse collapses at {fell['clients']} clients: follow-up turns reused their history "
                     f"{_pct(fell['follow_up_reuse_rate'])} of the time{held}, the cache evicted "
                     f"{_dash(fell.get('kv_evictions'))} entries and refused {_dash(fell.get('kv_rejected'))}, and "
                     f"their p50 TTFT was {f_(fell.get('follow_up_ttft_ratio'))}× the first turn's")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def best_of(rows) -> float:
    return max(r["follow_up_reuse_rate"] for r in rows)


def _pct(v) -> str:
    return f"{100 * v:.0f}%"


def _mb(v) -> str:
    return "engine's" if v is None else f"{v:g}"


def _dash(v) -> str:
    return "-" if v is None else str(v)
