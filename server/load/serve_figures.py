"""An open-loop level's figures, named as vLLM's `bench serve` names them where they mean the same.

Per request, from the client's clock (as vLLM measures, so a remote server is measured the same way):
ttft = sent -> first text chunk; e2el = sent -> stream ended; tpot = (e2el - ttft) / (output tokens - 1);
itl = the gaps between text chunks. Queue time is the server's (`timings.queue_ms`; None from a
server that does not report it). Goodput (DistServe's, as vLLM computes it): completed requests
whose every given objective holds (ttft, tpot, e2el <= its milliseconds) per second of the level's
duration; a one-token reply has no TPOT and, as in vLLM (where its TPOT is 0), meets a TPOT objective.

Field names: `request_throughput`, `output_throughput`, `total_token_throughput`, `request_goodput`,
`completed`, `duration`, `total_input_tokens`, `total_output_tokens`, `mean_/median_/std_/pNN_<metric>_ms`
for the metrics of `--percentile-metrics` (ttft, tpot, itl, e2el) are vLLM's; the rest are ours.
"""

from __future__ import annotations


import numpy as np

from .figures import BAD, COMPLETE

GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vLLM's --goodput keys
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM's --percentile-metrics names
DEFAULT_PERCENTILES = (50, 90, 99)
# The default objectives (--goodput, the Load tab): TTFT 2 s, the wait a chat user still takes as
# interactive; TPOT 189 ms = 1000 / 5.3 tok/s, the page's reading pace (ui/chat/records.py READING_PACE_TPS,
# tests/test_load_open.py keeps them equal): a reply that streams at least as fast as its reader reads.
DEFAULT_OBJECTIVES = {"ttft": 2000.0, "tpot": 189.0}
KNEE_SHARE = 0.95  # the knee: the lowest rate whose goodput is within 5% of the sweep's best
STOP_FACTOR = 10  # a sweep stops once p90 TTFT passes its objective tenfold


def parse_goodput(items) -> dict[str, float]:
    """`["ttft:2000", "tpot:150"]` (or one string "ttft:2000 tpot:150") -> {"ttft": 2000.0, "tpot": 150.0}."""
    if isinstance(items, str):
        items = items.replace(",", " ").split()
    out = {}
    for item in items or []:
        name, _, value = str(item).partition(":")
        if name not in GOODPUT_METRICS or not value:
            raise ValueError(f"goodput objectives are NAME:MS with NAME one of {', '.join(GOODPUT_METRICS)} "
                             f"(got {item!r})")
        ms = float(value)
        if not (ms > 0):
            raise ValueError(f"a goodput objective must be > 0 ms (got {item!r})")
        out[name] = ms
    return out


def request_metrics(r) -> dict:
    """One request's client-side metrics in ms (None where unknown)."""
    ttft, e2el, n = r.client_ttft_ms, r.client_e2e_ms, r.output_tokens
    tpot = (e2el - ttft) / (n - 1) if None not in (ttft, e2el, n) and n > 1 else None
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el, "itl": list(r.client_itl_ms or [])}


def meets(m: dict, objectives: dict) -> bool:
    """Every given objective holds (an unknown TTFT or E2E fails; a one-token reply meets TPOT)."""
    for name, limit in objectives.items():
        v = m[name]
        if v is None:
            if name == "tpot":
                continue
            return False
        if v > limit:
            return False
    return True


def stats(name: str, values, percentiles) -> dict:
    xs = [v for v in values if v is not None]
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", *(f"p{p:g}_{name}_ms" for p in percentiles)]
    if not xs:
        return dict.fromkeys(keys)
    a = np.asarray(xs, dtype=float)
    vals = [a.mean(), np.median(a), a.std(), *(np.percentile(a, p) for p in percentiles)]
    return {k: round(float(v), 2) for k, v in zip(keys, vals)}


def level_summary(results: list, duration: float, *, request_rate: float, burstiness: float,
                  objectives: dict, percentile_metrics=PERCENTILE_METRICS, percentiles=DEFAULT_PERCENTILES,
                  max_batch: int | None = None) -> dict:
    """One level's figures (the probe's result excluded by the caller)."""
    done = [r for r in results if r.outcome in COMPLETE]
    ms = [request_metrics(r) for r in done]
    good = sum(meets(m, objectives) for m in ms) if objectives else None
    out_tokens = sum(r.output_tokens or 0 for r in done)
    in_tokens = sum(r.prompt_tokens or (r.timings or {}).get("prompt_tokens") or 0 for r in done)
    per_user = [1e3 / m["tpot"] for m in ms if m["tpot"]]
    row = {"request_rate": request_rate, "burstiness": burstiness, "max_batch": max_batch,
           "duration": round(duration, 3), "num_prompts": len(results), "completed": len(done),
           "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
           "request_throughput": _per_s(len(done), duration), "output_throughput": _per_s(out_tokens, duration),
           "total_token_throughput": _per_s(out_tokens + in_tokens, duration),
           "request_goodput": _per_s(good, duration) if good is not None else None,
           "good_requests": good,
           "output_throughput_per_user": round(float(np.median(per_user)), 3) if per_user else None}
    for name in percentile_metrics:
        vals = [g for m in ms for g in m["itl"]] if name == "itl" else [m[name] for m in ms]
        row.update(stats(name, vals, percentiles))
    if "p90_ttft_ms" not in row:  # the sweep's stop rule reads it whatever was asked
        row["p90_ttft_ms"] = stats("ttft", [m["ttft"] for m in ms], (90,))["p90_ttft_ms"]
    row.update(stats("queue", [(r.timings or {}).get("queue_ms") for r in done], percentiles))
    counts = {k: sum(r.outcome == k for r in results) for k in (*COMPLETE, "cancelled", "429", "4xx", *BAD)}
    return {**row, **counts}


def _per_s(n, seconds) -> float | None:
    return round(n / seconds, 4) if seconds else None


def knee(rows: list[dict], share: float = KNEE_SHARE) -> int | None:
    """Index of the knee: the lowest offered rate whose goodput is at least `share` of the best goodput
    of the sweep (past it, more traffic buys no more requests served within the objectives). None when
    no level served any request within them."""
    goods = [r.get("request_goodput") for r in rows]
    best = max((g for g in goods if g is not None), default=None)
    if not best:
        return None
    return next(i for i, g in enumerate(goods) if g is not None and g >= share * best)


def saturated(row: dict, ttft_objective_ms: float, factor: float = STOP_FACTOR) -> bool:
    """The sweep's stop rule: p90 TTFT past `factor` times its objective, or nothing completed."""
    p90 = row.get("p90_ttft_ms")
    return p90 is None or p90 > factor * ttft_objective_ms
