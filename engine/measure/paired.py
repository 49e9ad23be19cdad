"""The one paired estimate of a ratio between two configs run in turns: every A/B verdict of the page
(ui/compare/stats.py) and every paired ratio a bench prints (engine/bench/quant_steps.py) goes through it.

Items. Each item ran once through A and once through B, in one order or the other: d = log(B/A) per
item, `orders[i]` "AB" where A ran first, "BA" where B did (None: not known). The estimate is exp of the
order-adjusted mean of d: the mean over the A-first items and the mean over the B-first items averaged
(the AB/BA crossover estimate), so an order effect cancels whatever the counts. With one order only it
is the plain mean.

The interval: a t-interval on d (df = n - 2 with both orders, n - 1 with one), at every n. Simulated
(`python -m ui.compare.coverage`, docs/ab-statistics.md), a bootstrap of the same estimate covers far
less than its 95% under ten items, and no size was found from which its coverage holds, while the
t-interval holds in every shape but a strongly skewed one, where the bootstrap does no better.
Pure functions over numpy and scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95  # each interval given


@dataclass(frozen=True)
class Estimate:
    """The order-adjusted mean log ratio, its interval and p-value (of log ratio 0)."""

    log_ratio: float
    lo: float
    hi: float
    p: float
    method: str  # t | exact | none (no degrees of freedom: under 3 items with both orders, 2 with one)
    sd: float  # of the log ratios about their order's mean (for the items a 5% difference needs)
    order_effect: float | None  # log: the second run of a pair against the first; None with one order


def order_groups(d: list[float], orders: list[str | None]) -> list[np.ndarray]:
    """The log ratios by order ([A-first, B-first]), or one group where only one order ran."""
    split = [np.array([x for x, o in zip(d, orders) if o == k]) for k in ("AB", "BA")]
    if all(len(g) for g in split) and sum(map(len, split)) == len(d):
        return split
    return [np.asarray(d, dtype=float)]


def estimate(d: list[float], orders: list[str | None], confidence: float = CONFIDENCE) -> Estimate:
    """The t-interval at any n with a degree of freedom (see the module's docstring for why not a
    bootstrap); without one, the estimate alone (method "none", the rest NaN). With both orders,
    the AB/BA crossover test: d of the A-first items against −d of the B-first ones, a pooled two-sample
    t-test (scipy.stats.ttest_ind) whose difference of means is twice the order-adjusted estimate; with
    one order, a one-sample t-test (ttest_1samp)."""
    groups = order_groups(d, orders)
    means = [float(g.mean()) for g in groups]
    est = float(np.mean(means))
    df = len(d) - len(groups)
    resid = np.concatenate([g - g.mean() for g in groups])
    sd = float(math.sqrt(np.sum(resid ** 2) / df)) if df > 0 else math.nan
    effect = (means[0] - means[1]) / 2 if len(groups) == 2 else None  # A-first items: B ran second
    if df <= 0:  # the estimate alone: no interval, no test
        return Estimate(est, math.nan, math.nan, math.nan, "none", math.nan, effect)
    if sd <= 1e-12:  # every item of an order the same ratio (to rounding): nothing to be unsure of
        return Estimate(est, est, est, 0.0 if est else 1.0, "exact", 0.0, effect)
    if len(groups) == 2:
        res, scale = sps.ttest_ind(groups[0], -groups[1], equal_var=True), 0.5
    else:
        res, scale = sps.ttest_1samp(groups[0], 0.0), 1.0
    ci = res.confidence_interval(confidence)
    return Estimate(est, scale * float(ci.low), scale * float(ci.high), float(res.pvalue), "t", sd, effect)
