"""An open-loop rate sweep: levels of offered request rate, from low up to saturation, each level a
schedule of arrivals (arrivals.py) sent by open-loop clients in a process of their own
(clients.py `drive_open_elsewhere`), every reply judged (pool.judge), the figures per level
(serve_figures.level_summary), the probe's stages per level, and the knee.

Rates: the given list, or automatic: from `start_rate` (default: half of what one request at a
time could serve, 1 / the median time of a request alone), times `factor` each level, until the
level saturates (p90 TTFT past its objective tenfold), goodput has fallen below half the sweep's
best (past the knee, more traffic only makes it worse), the rate passes `max_rate`, or `max_levels`.
Used by `python -m server.bench load --request-rate sweep` and the page's Load tab.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field

from .arrivals import Arrivals
from .clients import drive_open_elsewhere
from .figures import BAD
from .open_loop import PROBE
from .pool import Result, Turn
from .serve_figures import (
    DEFAULT_OBJECTIVES,
    DEFAULT_PERCENTILES,
    PERCENTILE_METRICS,
    knee,
    level_summary,
    saturated,
)

DEFAULT_TTFT_OBJECTIVE_MS = DEFAULT_OBJECTIVES["ttft"]  # the stop rule's objective when --goodput names no ttft
FALLEN_SHARE = 0.5  # stop once goodput falls below this share of the sweep's best


@dataclass(frozen=True)
class SweepSettings:
    rates: tuple[float, ...] = ()  # fixed levels; empty: automatic
    start_rate: float | None = None  # automatic: the first rate (None: half of one-at-a-time's)
    factor: float = 2.0
    max_levels: int = 10
    max_rate: float | None = None
    num_prompts: int | None = 16  # per level ...
    duration: float | None = None  # ... or the seconds each level keeps sending
    burstiness: float = 1.0
    process: str = "poisson"
    seed: int = 0
    objectives: dict = field(default_factory=dict)  # --goodput: {"ttft": ms, "tpot": ms, "e2el": ms}
    deadline: float = 300.0
    percentile_metrics: tuple[str, ...] = PERCENTILE_METRICS
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES

    @property
    def ttft_objective_ms(self) -> float:
        return self.objectives.get("ttft", DEFAULT_TTFT_OBJECTIVE_MS)


def alone_rate(turns: list[Turn]) -> float | None:
    """Requests per second one at a time would serve: 1 / the median reference's time alone."""
    xs = [t.ref_e2e_ms for t in turns if t.ref_e2e_ms]
    return 1e3 / statistics.median(xs) if xs else None


def first_rate(s: SweepSettings, turns: list[Turn]) -> float:
    if s.rates:
        return s.rates[0]
    if s.start_rate is not None:
        return s.start_rate
    alone = alone_rate(turns)
    return round(alone / 2, 3) if alone else 1.0


def probe_stages(r: Result | None) -> dict | None:
    """The probe's reply at one level: its stages (server timings where the server reports them, else
    the client's TTFT and the rest), the batch sizes it shared, and the judge's verdict."""
    if r is None:
        return None
    t = r.timings or {}
    sizes = t.get("batch_size") or []
    return {"outcome": r.outcome, "sent_s": r.sent_s, "queue_ms": t.get("queue_ms"), "setup_ms": t.get("setup_ms"),
            "prefill_ms": t.get("prefill_ms"), "decode_ms": t.get("decode_ms"), "ttft_ms": r.client_ttft_ms,
            "e2el_ms": r.client_e2e_ms, "output_tokens": r.output_tokens,
            "batch_size_mean": round(sum(sizes) / len(sizes), 2) if sizes else None,
            "batch_size_max": max(sizes) if sizes else None, "batch_sizes": sizes}


class Sweep:
    """One sweep against one URL (one max batch); `rows` grow level by level, `probes` beside them."""

    def __init__(self, s: SweepSettings, url: str, turns: list[Turn], *, probe: Turn | None = None,
                 max_batch: int | None = None, api_key: str | None = None, headers: dict | None = None,
                 after_level=None, stop: threading.Event | None = None, out=print):
        self.s, self.url, self.turns, self.probe = s, url, turns, probe
        self.max_batch, self.api_key, self.headers = max_batch, api_key, headers or {}
        self.after_level = after_level  # (sweep) -> bool: the worker went idle (False: it stayed busy)
        self.stop = stop or threading.Event()
        self.out = out
        self.rows: list[dict] = []
        self.probes: list[dict | None] = []
        self.points: list[dict] = []  # the current level's requests as they finish (live plots)
        self.rate: float | None = None  # the level running
        self.stuck_workers = 0
        self.stopped_because: str | None = None
        self.saturated_at: float | None = None  # the rate at which a stop rule saw saturation

    def rates(self):
        s = self.s
        if s.rates:
            yield from s.rates
            return
        rate = first_rate(s, self.turns)
        for _ in range(s.max_levels):
            if s.max_rate is not None and rate > s.max_rate:
                self.stopped_because = f"the next rate passes --sweep-max-rate {s.max_rate:g}"
                return
            yield rate
            if self.done_rising():
                self.saturated_at = rate
                return
            rate = round(rate * s.factor, 4)
        self.stopped_because = f"{s.max_levels} levels (the cap)"

    def done_rising(self) -> bool:
        row = self.rows[-1]
        if saturated(row, self.s.ttft_objective_ms):
            self.stopped_because = (f"p90 TTFT {row['p90_ttft_ms']} ms passed {self.s.ttft_objective_ms:g} ms "
                                    f"(the TTFT objective) tenfold")
            return True
        goods = [r["request_goodput"] for r in self.rows if r["request_goodput"] is not None]
        if goods and row["request_goodput"] is not None and row["request_goodput"] < FALLEN_SHARE * max(goods):
            self.stopped_because = "goodput fell below half the sweep's best: past the knee"
            return True
        return False

    def run(self) -> dict:
        s = self.s
        for i, rate in enumerate(self.rates()):
            if self.stop.is_set():
                self.stopped_because = "stopped"
                break
            self.rate, self.points = rate, []
            times = Arrivals(rate, s.burstiness, s.process, s.num_prompts, s.duration, s.seed).times()
            results, wall = drive_open_elsewhere(self.url, self.turns, times, s.deadline, self.api_key, self.headers,
                                                 on_result=self._seen, stop=self.stop, probe=self.probe)
            if self.after_level is not None and not self.after_level(self):
                self.stuck_workers += 1
            level = [r for r in results if r.key != PROBE]
            row = level_summary(level, wall, request_rate=rate, burstiness=s.burstiness, objectives=s.objectives,
                                percentile_metrics=s.percentile_metrics, percentiles=s.percentiles,
                                max_batch=self.max_batch)
            self.rows.append(row)
            self.probes.append(probe_stages(next((r for r in results if r.key == PROBE), None)))
            self.out(level_line(row))
        self.rate = None
        return self.result()

    def _seen(self, r: Result) -> None:
        self.points.append({"key": r.key, "outcome": r.outcome, "sent_s": r.sent_s, "ttft_ms": r.client_ttft_ms,
                            "e2el_ms": r.client_e2e_ms})

    def result(self) -> dict:
        k = knee(self.rows)
        goods = [r["request_goodput"] for r in self.rows if r["request_goodput"] is not None]
        totals = {key: sum(r[key] for r in self.rows) for key in ("num_prompts", "exact", "differs", "cancelled",
                                                                    "429", "4xx", *BAD)}
        probe_bad = sum(1 for p in self.probes if p and p["outcome"] in (*BAD, "4xx", "429"))
        return {"max_batch": self.max_batch, "levels": self.rows, "probes": self.probes,
                "knee_index": k, "knee_request_rate": self.rows[k]["request_rate"] if k is not None else None,
                "max_request_goodput": max(goods) if goods else None, "stopped_because": self.stopped_because,
                # the knee is only found once a level past it saturated; at the cap it is a lower bound
                "knee_reached": self.saturated_at is not None if not self.s.rates else None,  # None: fixed levels
                "goodput_objectives": dict(self.s.objectives), "totals": totals, "stuck_workers": self.stuck_workers,
                "ok": sum(totals[b] for b in BAD) + totals["4xx"] + totals["429"] + probe_bad
                      + self.stuck_workers == 0}


def level_line(row: dict) -> str:
    def f(v):
        return "-" if v is None else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"

    bad = ", ".join(f"{k} {row[k]}" for k in BAD)
    return (f"rate {f(row['request_rate'])} req/s{' (max batch ' + str(row['max_batch']) + ')' if row['max_batch'] else ''}: "
            f"{row['completed']}/{row['num_prompts']} done in {row['duration']:.1f} s, "
            f"{f(row['request_throughput'])} req/s, {f(row['output_throughput'])} tok/s, "
            f"goodput {f(row['request_goodput'])} req/s | ttft p50/p90 {f(row.get('median_ttft_ms'))}/"
            f"{f(row.get('p90_ttft_ms'))} ms, tpot p90 {f(row.get('p90_tpot_ms'))} ms, queue p90 "
            f"{f(row.get('p90_queue_ms'))} ms | {bad}")
