"""The Load tab's figures: a point per finished request, a run's figures (the load's
`level_row`, typed), throughput over time, the delta table of two runs and the sentence that
states their trade-off, and each request of run 2 against the same request in run 1 through the
A/B statistics (ui/compare/stats.py, ui/compare/verdict.py): a verdict with intervals, floors and Holm's correction.
Unknown values are None (a dash on the page), never 0."""

from __future__ import annotations

import html
import math
from dataclasses import asdict, dataclass

from server.load.runs import COMPLETE, JUDGED, level_row, prefill_clause

from ..compare import stats, verdict
from ..shell.glossary import METRICS


@dataclass(frozen=True)
class LoadPoint:
    """One request of a run, when its client had the whole reply (seconds since the run started)."""

    t_s: float
    outcome: str  # the judge's verdict (exact, crossed…) or the HTTP failure (4xx, 429, 5xx)
    output_tokens: int | None
    ttft_ms: float | None
    tpot_ms: float | None
    queue_ms: float | None
    e2e_ms: float | None
    request_id: str | None = None  # the server's id (its trace: POST /lab/trace, ui/trace/trace.js)
    key: str | None = None  # which scripted turn ("c3t1"): the same request in the other run

    @classmethod
    def of(cls, result, t_s: float) -> LoadPoint:
        """From the load's Result (server/load/pool.py): the server's `timings` of the request."""
        t = result.timings or {}
        return cls(round(t_s, 3), result.outcome, t.get("output_tokens"), t.get("ttft_ms"), t.get("tpot_ms"),
                   t.get("queue_ms"), t.get("e2e_ms"), t.get("request_id") or None, getattr(result, "key", None))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ThroughputPoint:
    t_s: float  # the end of the window
    req_per_s: float
    output_tok_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def throughput_series(points: list[LoadPoint], elapsed_s: float, steps: int = 20) -> list[ThroughputPoint]:
    """Throughput of the run so far, at `steps` times: requests and output tokens completed (whole
    replies: exact, or differing where exactness is not promised) up to t, divided by t. It settles on the run's figure (its last point is the delta
    table's), where a per-window count would jump with every burst of replies finishing together."""
    if elapsed_s <= 0:
        return []
    width = max(0.25, elapsed_s / steps)
    ends = [min((i + 1) * width, elapsed_s) for i in range(math.ceil(elapsed_s / width - 1e-9))]
    done = sorted((p.t_s, p.output_tokens or 0) for p in points if p.outcome in COMPLETE)
    out, i, reqs, toks = [], 0, 0, 0
    for t in ends:
        while i < len(done) and done[i][0] <= t:
            reqs, toks, i = reqs + 1, toks + done[i][1], i + 1
        out.append(ThroughputPoint(round(t, 3), round(reqs / t, 3), round(toks / t, 2)))
    return out


@dataclass(frozen=True)
class RunFigures:
    """A run's figures: throughput over its wall time, percentiles of the server's timings (completed,
    exact replies), and the judge's counts."""

    clients: int
    requests: int
    wall_s: float
    req_per_s: float | None
    output_tok_per_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    tpot_ms_p50: float | None
    tpot_ms_p90: float | None
    queue_ms_p50: float | None
    queue_ms_p90: float | None
    e2e_ms_p50: float | None
    batch_size_mean: float | None  # None: the server reported no batch sizes (a remote, say)
    with_prompt_share: float | None  # decode tokens whose forward carried a newcomer's prompt (0..1)
    itl_ms_with_prompt_p50: float | None
    itl_ms_decode_only_p50: float | None
    exact: int
    differs: int  # whole replies unlike their reference where exactness is not promised (bf16, a remote…)
    cancelled: int
    lost: int
    crossed: int
    mismatched: int
    stuck: int
    errors: int  # 4xx, 429 and 5xx answers

    @classmethod
    def of(cls, clients: int, results: list, wall_s: float) -> RunFigures:
        row = level_row(clients, results, wall_s)
        return cls(clients=clients, requests=row["requests"], wall_s=row["wall_s"], req_per_s=row["req_per_s"],
                   output_tok_per_s=row["output_tok_per_s"],
                   **{f"{m}_{q}": row[f"{m}_{q}"] for m in ("ttft_ms", "tpot_ms", "queue_ms") for q in ("p50", "p90")},
                   e2e_ms_p50=row["e2e_ms_p50"],
                   **{k: row[k] for k in ("batch_size_mean", "with_prompt_share", "itl_ms_with_prompt_p50",
                                          "itl_ms_decode_only_p50")},
                   **{k: row[k] for k in JUDGED}, errors=row["4xx"] + row["429"] + row["5xx"])

    def to_dict(self) -> dict:
        return asdict(self)


# (field, label, glossary metric for the hover, higher is better)
DELTA_ROWS = (
    ("output_tok_per_s", "output tok/s", None, True),
    ("req_per_s", "requests/s", None, True),
    ("ttft_ms_p50", "TTFT p50 (ms)", "ttft_ms", False),
    ("ttft_ms_p90", "TTFT p90 (ms)", "ttft_ms", False),
    ("tpot_ms_p50", "TPOT p50 (ms)", "tpot_ms", False),
    ("tpot_ms_p90", "TPOT p90 (ms)", "tpot_ms", False),
    ("queue_ms_p50", "queue p50 (ms)", "queue_ms", False),
    ("queue_ms_p90", "queue p90 (ms)", "queue_ms", False),
    ("e2e_ms_p50", "total p50 (ms)", "e2e_ms", False),
    ("batch_size_mean", "mean batch size", "batch_size", None),
    ("with_prompt_share", "decode tokens beside a prefill (%)", "with_prompt_share", None),
    ("itl_ms_with_prompt_p50", "ITL p50 beside a prefill (ms)", "itl_ms_with_prompt_p50", False),
    ("itl_ms_decode_only_p50", "ITL p50, decode-only forwards (ms)", "itl_ms_decode_only_p50", False),
    ("requests", "requests", None, None),
    ("exact", "exact (as alone)", None, None),
    ("differs", "differs (exactness not promised)", None, None),
    ("lost", "lost", None, False),
    ("crossed", "crossed", None, False),
    ("mismatched", "mismatched", None, False),
    ("stuck", "stuck", None, False),
    ("errors", "errors (4xx/5xx)", None, False),
)


def fmt_share(v) -> str:
    """A fraction shown as a percentage (a glossary metric whose unit is %)."""
    return "—" if v is None else f"{v:.0%}"


def fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"


def ratio(a, b) -> float | None:
    return round(b / a, 4) if a and b is not None else None


def fmt_ratio(r) -> str:
    """2.21×; a small ratio keeps two significant digits (0.0045×, not 0.00×)."""
    return "—" if r is None else f"{r:.2f}×" if r >= 0.1 else f"{r:.2g}×"


PAIRED = ["ttft_ms", "tpot_ms", "queue_ms", "e2e_ms"]  # per request, run 2 against run 1
FLOOR_OF = {"output_tok_per_s": "output_throughput", "req_per_s": "request_throughput"}  # one figure per run


def request_pairs(one, two) -> list[stats.PairedRatio]:
    """Each whole reply of run 2 against the same scripted request in run 1 (its n-th play of the same
    turn), as the A/B statistics' items: run 1 is A, run 2 is B, and run 1 always ran first."""
    rows = []
    for pane, run in (("A", one), ("B", two)):
        seen: dict[str, int] = {}
        for p in run.points:
            if p.outcome in COMPLETE and p.key:
                seen[p.key] = seen.get(p.key, 0) + 1
                rows.append({**p.to_dict(), "pane": pane, "item": p.key, "turn": seen[p.key], "order": "AB"})
    return stats.paired_table(rows, PAIRED)


def _better(name: str, metric, higher, va, vb, decided: dict) -> str | None:
    """The side a row marks: a per-request latency only where the A/B statistics name that side (and
    the row agrees); another figure of the glossary, or a throughput (once per run: no interval), only
    beyond its practical floors; a count exactly."""
    if higher is None or va is None or vb is None or va == vb:
        return None
    side = "b" if (vb > va) == higher else "a"
    if metric in PAIRED:
        return side if decided.get(metric) == side.upper() else None
    floors = metric if metric in METRICS else FLOOR_OF.get(name)
    return side if floors is None or stats.beyond_floors(floors, va, vb) else None


def delta_html(one, two) -> str:
    """Run 1 against run 2 (RunState), a row per figure, the better of each marked where it is decided;
    then the per-request verdict and its table."""
    a, b = one.figures, two.figures
    table = request_pairs(one, two)
    decided = {p.metric: p.winner for p in table if p.winner}
    trs = []
    for name, label, metric, higher in DELTA_ROWS:
        va, vb = getattr(a, name), getattr(b, name)
        better = _better(name, metric, higher, va, vb, decided)
        show = fmt_share if metric in METRICS and METRICS[metric].unit == "%" else fmt
        cells = "".join(f'<td{" class=lab-win" if better == side else ""}>{show(v)}</td>'
                        for side, v in (("a", va), ("b", vb)))
        r = ratio(va, vb)
        hover = METRICS[metric].hover if metric in METRICS else label
        trs.append(f'<tr data-metric="{name}"><th title="{html.escape(hover)}">{html.escape(label)}</th>{cells}'
                   f'<td>{fmt_ratio(r)}</td></tr>')
    said = verdict.verdict(table, who="Run 2", first="run 1")
    paired = (f'<p class="lab-verdict lab-load-verdict"><b>Per request</b> (run 1 as A, run 2 as B). {html.escape(said)}</p>'
              f'{verdict.table_html(table, first="run 1")}') if said else ""
    return ('<table class="lab-table lab-delta lab-load-delta"><thead><tr><th>figure</th>'
            f"<th>run 1: {html.escape(one.label)}</th><th>run 2: {html.escape(two.label)}</th><th>2 / 1</th></tr>"
            f'</thead><tbody>{"".join(trs)}</tbody></table>'
            '<p class="lab-muted">Marked: TTFT, TPOT, queue and total where the per-request statistics below decide '
            'them; a figure the runs have once each (no interval) where it differs by at least its practical floor; '
            'a count as it is.</p>' + paired)


def pair_sentence(clients: int, one, two) -> str:
    """The trade-off in the measured numbers, in one sentence."""
    a, b = one.figures, two.figures
    r = ratio(a.output_tok_per_s, b.output_tok_per_s)
    head = (f"{two.label.capitalize()} gave {fmt_ratio(r)} the output tok/s of {one.label} at {clients} clients "
            f"({fmt(b.output_tok_per_s)} vs {fmt(a.output_tok_per_s)})")
    lat = (f"p50 TTFT went from {fmt(a.ttft_ms_p50)} to {fmt(b.ttft_ms_p50)} ms, p50 queue from "
           f"{fmt(a.queue_ms_p50)} to {fmt(b.queue_ms_p50)} ms and p50 TPOT from {fmt(a.tpot_ms_p50)} to "
           f"{fmt(b.tpot_ms_p50)} ms")
    why = ""
    if None not in (a.tpot_ms_p50, b.tpot_ms_p50, a.queue_ms_p50, b.queue_ms_p50):
        if b.tpot_ms_p50 > a.tpot_ms_p50 and b.queue_ms_p50 < a.queue_ms_p50:
            why = ": each step serves more requests and takes longer, so requests wait less to start but decode slower"
        elif b.tpot_ms_p50 < a.tpot_ms_p50 and b.queue_ms_p50 > a.queue_ms_p50:
            why = ": fewer requests per step, faster steps, longer waits to start"
    same = "" if one.max_batch != two.max_batch else " (both runs had the same max batch: the difference is noise)"
    return f"{head}; {lat}{why}{same}.{_prefill_clause(two)}"


def _prefill_clause(run) -> str:
    """Why a batch is slower a step: the share of its tokens made beside a newcomer's prompt."""
    f = run.figures
    if not f.with_prompt_share or f.itl_ms_with_prompt_p50 is None:
        return ""
    clause = prefill_clause(f.with_prompt_share, f.itl_ms_with_prompt_p50, f.itl_ms_decode_only_p50, fmt)
    return f" In {run.label}, {clause}: prompt tokens cost nearly as much batched as alone."


# KV reuse under load (server/load/reuse.py): per run, the prefix cache's figures and follow-up turns' TTFT.
REUSE_COLUMNS = (("kv_budget_mb", "KV budget", lambda v: "—" if v is None else f"{v:g} MiB"),
                 ("clients", "clients", fmt), ("follow_ups", "follow-ups", fmt),
                 ("follow_up_reuse_rate", "history reused", fmt_share), ("prefix_hit_rate", "prefix hit rate", fmt_share),
                 ("kv_evictions", "evictions", fmt), ("kv_rejected", "refused", fmt),
                 ("first_turn_ttft_ms_p50", "first-turn TTFT p50", lambda v: "—" if v is None else f"{fmt(v)} ms"),
                 ("follow_up_ttft_ms_p50", "follow-up TTFT p50", lambda v: "—" if v is None else f"{fmt(v)} ms"),
                 ("follow_up_ttft_ratio", "follow-up / first", fmt_ratio))


def reuse_html(rows: list[dict]) -> str:
    """The runs' KV reuse figures as a table (rows: reuse.py's figures plus each run's label)."""
    def th(name, label):
        hover = METRICS[name].hover if name in METRICS else label
        return f'<th title="{html.escape(hover)}">{html.escape(label)}</th>'

    head = "<th>run</th>" + "".join(th(k, label) for k, label, _ in REUSE_COLUMNS)
    body = "".join("<tr>" + f"<td>{html.escape(str(r.get('run', '')))}</td>" +
                   "".join(f'<td data-k="{k}">{html.escape(f(r.get(k)))}</td>' for k, _, f in REUSE_COLUMNS) + "</tr>"
                   for r in rows)
    return f'<table class="lab-reuse-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
