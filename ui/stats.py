"""Paired statistics for two configs: per metric, the B/A ratio of medians with a 95% confidence
interval by paired bootstrap over items (scipy.stats.bootstrap), a winner only where that interval
excludes 1, and how many items would detect a 5% difference at the spread observed.

Pairs: each item (a sweep's conversation turn, or one repeated A/B run of a prompt) was run through
A and B back to back, so a neighbour's load that slows an item slows both sides; resampling items
(not replies) keeps that pairing. The bootstrap is seeded: the same figures give the same interval.

Items to detect a 5% difference: the smallest n at which a two-sided paired t-test on the log-ratios
log(B/A) (alpha 0.05) has 80% power against a true ratio of 1.05, at the standard deviation of the
log-ratios observed here; the power is exact (noncentral t, scipy.stats.nct), not the normal
approximation. Pure functions: no engine, no Gradio.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from .glossary import METRICS

CONFIDENCE = 0.95
RESAMPLES = 4000
SEED = 20261203  # fixed: the same data gives the same interval
DETECT_RATIO = 1.05  # "a 5% difference"
ALPHA, POWER = 0.05, 0.80
MAX_ITEMS_SHOWN = 100_000
# The metrics a ratio means something for (positive on both sides); the verdict names the first ones.
PAIRED_METRICS = ["ttft_ms", "tpot_ms", "e2e_ms", "prefill_ms", "decode_tps", "queue_ms", "output_tokens"]


@dataclass(frozen=True)
class PairedRatio:
    metric: str
    n: int  # items with a positive value on both sides
    ratio: float | None  # median(B) / median(A)
    lo: float | None  # its 95% interval (paired bootstrap over items)
    hi: float | None
    winner: str | None  # "A" | "B" where the interval excludes 1 and the metric has a direction; else None
    items_to_detect: int | None  # items a paired t-test on log(B/A) needs to see a 5% difference (80% power)
    method: str = ""  # the bootstrap's interval method (BCa; percentile where BCa is undefined)

    @property
    def decided(self) -> bool:
        return self.lo is not None and (self.lo > 1 or self.hi < 1)

    def to_dict(self) -> dict:
        return asdict(self)


def paired_values(rows: list[dict], metric: str, key=("item", "turn")) -> tuple[list[float], list[float]]:
    """(A values, B values) of the items both sides have a positive `metric` for, in item order.
    `rows`: one per reply with `pane` "A" or "B" and the item key (a sweep's rows)."""
    sides: dict[str, dict] = {"A": {}, "B": {}}
    for r in rows:
        v = r.get(metric)
        if r.get("pane") in sides and isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            sides[r["pane"]][tuple(r.get(k) for k in key)] = float(v)
    both = [k for k in sides["A"] if k in sides["B"]]
    return [sides["A"][k] for k in both], [sides["B"][k] for k in both]


def _ratio_of_medians(a, b, axis=-1):
    return np.median(b, axis=axis) / np.median(a, axis=axis)


def ratio_interval(a: list[float], b: list[float], seed: int = SEED) -> tuple[float, float, str]:
    """The 95% interval of median(B)/median(A) by paired bootstrap over items."""
    data = (np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    ratios = data[1] / data[0]
    if np.allclose(ratios, ratios[0], rtol=0, atol=0):  # every item the same ratio: no spread to resample
        r = float(_ratio_of_medians(*data))
        return r, r, "exact"
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BCa on degenerate resamples warns, then gives NaN: next method
            res = sps.bootstrap(data, _ratio_of_medians, paired=True, vectorized=True, confidence_level=CONFIDENCE,
                                n_resamples=RESAMPLES, method=method, rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi, method
    r = float(_ratio_of_medians(*data))
    return r, r, "none"


def items_to_detect(log_ratios: list[float], ratio: float = DETECT_RATIO, alpha: float = ALPHA,
                    power: float = POWER) -> int | None:
    """Smallest n with `power` for a two-sided paired t-test (alpha) to detect a true ratio `ratio`,
    at the standard deviation of `log_ratios`; None with fewer than 2 of them."""
    if len(log_ratios) < 2:
        return None
    sd = statistics.stdev(log_ratios)
    effect = abs(math.log(ratio))
    if sd == 0:
        return 2
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    n = max(2, math.ceil((z * sd / effect) ** 2))  # the normal approximation: a start, then the exact t
    while n < MAX_ITEMS_SHOWN:
        df, nc = n - 1, effect / sd * math.sqrt(n)
        t = sps.t.ppf(1 - alpha / 2, df)
        if sps.nct.sf(t, df, nc) + sps.nct.cdf(-t, df, nc) >= power:
            return n
        n += 1
    return MAX_ITEMS_SHOWN


def paired_ratio(metric: str, a: list[float], b: list[float], seed: int = SEED) -> PairedRatio:
    n = len(a)
    if n == 0:
        return PairedRatio(metric, 0, None, None, None, None, None)
    ratio = float(_ratio_of_medians(np.asarray(a), np.asarray(b)))
    logs = [math.log(y / x) for x, y in zip(a, b)]
    if n < 2:
        return PairedRatio(metric, n, ratio, None, None, None, None)
    lo, hi, method = ratio_interval(a, b, seed)
    better = METRICS[metric].better if metric in METRICS else ""
    winner = None
    if better and (lo > 1 or hi < 1):
        b_higher = lo > 1
        winner = "B" if b_higher == (better == "higher") else "A"
    return PairedRatio(metric, n, ratio, lo, hi, winner, items_to_detect(logs), method)


def paired_table(rows: list[dict], metrics: list[str] = PAIRED_METRICS, key=("item", "turn"),
                 seed: int = SEED) -> list[PairedRatio]:
    """One PairedRatio per metric that has at least one item on both sides."""
    out = []
    for m in metrics:
        a, b = paired_values(rows, m, key)
        if a:
            out.append(paired_ratio(m, a, b, seed))
    return out


def fmt_ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.3f}x"


def interval_text(p: PairedRatio) -> str:
    if p.lo is None:
        return "—"
    return f"{p.lo:.2f}–{p.hi:.2f}"


def decision_text(p: PairedRatio) -> str:
    """'B' / 'A' / 'no difference detected (n = 8)' / 'no direction' / 'needs 2 items'."""
    if p.lo is None:
        return f"needs at least 2 items (n = {p.n})"
    if p.winner:
        return p.winner
    if p.decided:
        return f"{'higher' if p.lo > 1 else 'lower'} in B (no better side)"
    return f"no difference detected (n = {p.n})"
