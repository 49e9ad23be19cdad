"""The load's figures: a row per level (counts, throughput, percentiles of the server's timings),
its Markdown table, repeats merged, and two max batches compared (table and sentence).
"""

from __future__ import annotations

import numpy as np

from .pool import Result

METRICS = ("queue_ms", "ttft_ms", "tpot_ms", "e2e_ms")
BAD = ("lost", "crossed", "mismatched", "stuck", "5xx")
COMPLETE = ("exact", "differs")  # whole replies: what throughput and latency count
JUDGED = (*COMPLETE, "cancelled", *(k for k in BAD if k != "5xx"))  # the judge's verdicts (pool.judge)


def percentiles(values) -> dict:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{q}": round(float(np.percentile(xs, q)), 2) for q in (50, 90, 99)}


def level_row(clients: int, results: list[Result], wall_s: float) -> dict:
    done = [r for r in results if r.outcome in COMPLETE]
    counts = {k: sum(r.outcome == k for r in results) for k in (*COMPLETE, "cancelled", "429", "4xx", *BAD)}
    out_tokens = sum((r.timings or {}).get("output_tokens", 0) for r in done)
    row = {"clients": clients, "requests": len(results), **counts, "wall_s": round(wall_s, 2),
           "req_per_s": round(len(done) / wall_s, 3) if wall_s else None,
           "output_tok_per_s": round(out_tokens / wall_s, 2) if wall_s else None}
    for m in METRICS:
        for q, v in percentiles([(r.timings or {}).get(m) for r in done]).items():
            row[f"{m}_{q}"] = v
    row["client_ttft_ms_p50"] = percentiles([r.client_ttft_ms for r in done])["p50"]
    sizes = [b for r in done for b in (r.timings or {}).get("batch_size") or []]  # tokens' forwards, all requests
    row["batch_size_mean"] = round(float(np.mean(sizes)), 2) if sizes else None  # None: the server sent none
    row.update(prompt_split(done))
    return row


def prompt_split(done: list[Result]) -> dict:
    """Decode tokens (i >= 1) by whether the forward that made them carried prompt tokens
    (`batch_prompt_tokens[i]` > 0, a newcomer's prefill riding in the batch): their share and each
    kind's p50 ITL. Why a batch of N does not give N times the tokens: prompt rows are compute-bound
    and cost nearly as much in a batch as alone, and every token of that forward waits for them. None
    where the server reported no `batch_prompt_tokens` (max batch 1, a remote server)."""
    beside, alone = [], []
    for r in done:
        t = r.timings or {}
        prompts, itl = t.get("batch_prompt_tokens"), t.get("itl_ms")
        if prompts is None or itl is None:
            continue
        for n, gap in zip(prompts[1:], itl):  # itl_ms[i - 1]: token i - 1 to token i
            (beside if n else alone).append(gap)
    total = len(beside) + len(alone)
    return {"with_prompt_share": round(len(beside) / total, 3) if total else None,
            "itl_ms_with_prompt_p50": percentiles(beside)["p50"], "itl_ms_decode_only_p50": percentiles(alone)["p50"]}


def prefill_clause(share: float, with_prompt_p50, decode_only_p50, fmt) -> str:
    """The prompt split (prompt_split) in words, for the bench's trade-off and the Load tab's sentence."""
    return (f"{share:.0%} of the decode tokens shared their forward with a newcomer's prompt (p50 ITL "
            f"{fmt(with_prompt_p50)} ms, against {fmt(decode_only_p50)} ms in decode-only forwards)")


def failures(totals: dict, stuck_workers: int, server_5xx: int, queue_bounded: bool) -> int:
    """What makes a load fail: the judge's bad verdicts, 4xx, a worker left busy, 5xx the server
    counted, and 429 unless the queue was bounded on purpose (--max-queue)."""
    return (sum(totals[k] for k in BAD) + totals["4xx"] + stuck_workers + server_5xx
            + (0 if queue_bounded else totals["429"]))


def totals_line(t: dict) -> str:
    """The judge's counts over a whole load, in words."""
    return ("lost {lost}, crossed {crossed}, mismatched {mismatched}, stuck {stuck}, 5xx {5xx} of {requests} "
            "requests ({exact} exact, {differs} differing where exactness is not promised, {cancelled} cancelled "
            "on purpose)".format(**t))


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows (as in docs/reliability.md)."""
    head = ["clients", "requests", "req/s", "tok/s"] + [f"{m} p50/p90/p99" for m in METRICS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["clients"], r["requests"], r["req_per_s"], r["output_tok_per_s"]] + [
            " / ".join("-" if r[f"{m}_{q}"] is None else f"{r[f'{m}_{q}']:,.0f}" for q in ("p50", "p90", "p99"))
            for m in METRICS]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def merge_rows(rows: list[dict]) -> dict:
    """Repeats of one level: counts and wall time add up; percentiles are those of the first run
    when there is one, else a median of the runs' (good enough for --repeat 2 on a shared machine)."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    for k in ("requests", *COMPLETE, "cancelled", "429", "4xx", *BAD):
        out[k] = sum(r[k] for r in rows)
    out["wall_s"] = round(sum(r["wall_s"] for r in rows), 2)
    for k, v in rows[0].items():
        if k.endswith(("_p50", "_p90", "_p99", "_per_s")) or k in ("batch_size_mean", "with_prompt_share"):
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
                          ("batch_size_mean", "batch_size_mean"), ("with_prompt_share", "with_prompt_share"),
                          ("itl_ms_with_prompt_p50", "itl_with_prompt_p50"),
                          ("itl_ms_decode_only_p50", "itl_decode_only_p50")):
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
    if top.get("with_prompt_share_b") is not None:
        parts.append(prefill_clause(top["with_prompt_share_b"], top["itl_with_prompt_p50_b"],
                                    top["itl_decode_only_p50_b"], f_))
    return "; ".join(parts) + "."


def f_(v) -> str:
    return "n/a" if v is None else f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}"
