"""Paired statistics for two configs: the one module every A/B verdict goes through (the Sweep, the
A/B tab's repeated pairs, the Load tab's pairs, `python -m ui.compare.abtest`). Per metric: B/A over the
items with its 95% interval and p-value, decisions corrected across the table (Holm), the practical
floors, and the items a 5% difference would need. Pure functions: no model, no Gradio.

Items. Each item (a sweep's conversation turn, a repeated A/B run of one prompt, a request played in
both Load runs) ran once through A and once through B; d = log(B/A) per item. Which config runs
first alternates pair by pair (COUNTERBALANCE, ABBA): the second run of a pair can inherit what the
first warmed up, an order effect that reads as a difference when A always runs first.

The estimate and its interval come from engine/measure/paired.py, the one paired estimate (the benches'
paired ratios use it too): B/A = exp of the order-adjusted mean of d (the AB/BA crossover estimate), so
an order effect cancels whatever the counts, and is reported (`order_effect`: the second run of a pair
over the first); with one order only (the Load tab: run 1 always first) the plain mean, and the order
is confounded. A t-interval on d at every n: a BCa bootstrap was the page's interval before, and
covered far less than its 95% under ten items (`python -m ui.compare.coverage`, docs/ab-statistics.md).
Below MIN_ITEMS: "too few items to decide".

Decisions: ALPHA is family-wise over the table: Holm's step-down over every metric's p-value (the
headline metrics included), so an A/A table names a winner at most ALPHA of the time. A decided
difference inside a metric's floors (ui/shell/glossary.py `Metric.floors`) reads "no practical difference".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy import stats as sps

from engine.measure.paired import CONFIDENCE, estimate

from ..shell.glossary import METRICS

ALPHA = 0.05  # family-wise, over a table's metrics
MIN_ITEMS = 3  # fewer: "too few items to decide" (an order-adjusted t-interval needs n − 2 ≥ 1)
DETECT_RATIO = 1.05  # "a 5% difference"
POWER = 0.80
MAX_ITEMS_SHOWN = 100_000
P_SHOWN = 1e-4  # a smaller p-value is shown as "< 0.0001"
COUNTERBALANCE = ("AB", "BA", "BA", "AB")  # which config runs first, pair by pair (ABBA, repeating)
WARMUP_PAIRS = 1  # the first pair of a run: shown, not counted (one-time costs land in it)
# The metrics a ratio means something for (positive on both sides). Not decode speed: it is 1 / TPOT item
# by item, the same test, and a second copy would only cost the others power under the correction.
PAIRED_METRICS = ["ttft_ms", "tpot_ms", "e2e_ms", "prefill_ms", "queue_ms", "output_tokens"]


def pair_order(index: int) -> str:
    """"AB" or "BA": which config runs first in the index-th counted pair (0-based)."""
    return COUNTERBALANCE[index % len(COUNTERBALANCE)]


def items_to_detect(sd: float | None, ratio: float = DETECT_RATIO, alpha: float = ALPHA,
                    power: float = POWER) -> int | None:
    """Smallest n (counterbalanced: df = n − 2) at which a two-sided t-test on log(B/A) at `alpha` has
    `power` against a true ratio `ratio`, at the standard deviation `sd` of the log ratios (exact:
    noncentral t); None without a spread."""
    if sd is None or not math.isfinite(sd):
        return None
    effect = abs(math.log(ratio))
    if sd == 0:
        return MIN_ITEMS
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    n = max(MIN_ITEMS, math.ceil((z * sd / effect) ** 2))  # the normal approximation: a start, then the exact t
    while n < MAX_ITEMS_SHOWN:
        df, nc = n - 2, effect / sd * math.sqrt(n)
        if nc > 40:  # power is then essentially 1 (and scipy's noncentral t is slow out there)
            return n
        t = sps.t.ppf(1 - alpha / 2, df)
        if sps.nct.sf(t, df, nc) + sps.nct.cdf(-t, df, nc) >= power:
            return n
        n += 1
    return MAX_ITEMS_SHOWN


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None). Written out: scipy has no Holm (its
    false_discovery_control is Benjamini–Hochberg), and statsmodels would be a dependency for six lines."""
    ranked = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - rank) * pvalues[i]))
        out[i] = running
    return out


def beyond_floors(metric: str, a: float | None, b: float | None) -> bool:
    """Whether B differs from A by at least both of the metric's floors (relative and absolute)."""
    if a is None or b is None:
        return False
    rel, absolute = METRICS[metric].floors if metric in METRICS else (0.0, 0.0)
    if abs(b - a) < absolute or a == b:
        return False
    return not (a > 0 and b > 0 and abs(math.log(b / a)) < math.log1p(rel))


@dataclass(frozen=True)
class PairedRatio:
    metric: str
    n: int  # items with a positive value on both sides
    ratio: float | None  # B/A: exp of the order-adjusted mean of log(B/A) over the items
    lo: float | None  # its 95% interval
    hi: float | None
    winner: str | None  # "A" | "B": decided after correction, beyond the floors, and the metric has a direction
    items_to_detect: int | None  # items a t-test on log(B/A) needs to see a 5% difference (80% power, corrected α)
    method: str = ""  # t | exact
    p: float | None = None  # of "no difference", this metric alone
    p_holm: float | None = None  # corrected across the table (Holm)
    decision: str = ""  # winner | different | no practical difference | no difference | too few
    order_effect: float | None = None  # the second run of a pair / the first (None: one order ran)
    orders: str = ""  # "4 AB, 4 BA" | "AB only"
    difference: float | None = None  # B − A at A's median, in the metric's unit (the absolute floor's test)
    practical: bool = False  # the estimate moves by at least both of the metric's floors
    sd: float | None = None  # of log(B/A) about each order's mean

    @property
    def decided(self) -> bool:
        return self.p_holm is not None and self.p_holm <= ALPHA

    def to_dict(self) -> dict:
        return asdict(self)


def paired_values(rows: list[dict], metric: str, key=("item", "turn")
                  ) -> tuple[list[float], list[float], list[str | None]]:
    """(A values, B values, orders) of the items both sides have a positive `metric` for, in item
    order. `rows`: one per reply with `pane` "A" or "B", the item key and (counterbalanced runs)
    `order`, "AB" or "BA"; warm-up rows (`warmup`) are left out."""
    sides: dict[str, dict] = {"A": {}, "B": {}}
    orders: dict[tuple, str | None] = {}
    for r in rows:
        v = r.get(metric)
        if r.get("warmup") or r.get("pane") not in sides:
            continue
        k = tuple(r.get(x) for x in key)
        orders.setdefault(k, r.get("order"))
        if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            sides[r["pane"]][k] = float(v)
    both = [k for k in sides["A"] if k in sides["B"]]
    return [sides["A"][k] for k in both], [sides["B"][k] for k in both], [orders.get(k) for k in both]


def paired_ratio(metric: str, a: list[float], b: list[float], orders: list[str | None] | None = None,
                 detect_alpha: float | None = ALPHA) -> PairedRatio:
    """One metric alone (p_holm = p): the table (`paired_table`) corrects across its metrics.
    `detect_alpha` None: no items-for-5% (the table sets it once it knows its correction)."""
    n = len(a)
    orders = orders or [None] * n
    counts = {k: sum(o == k for o in orders) for k in ("AB", "BA")}
    said = ", ".join(f"{c} {k}" for k, c in counts.items()) if all(counts.values()) else (
        f"{next((k for k, c in counts.items() if c), 'order unknown')} only")
    if n == 0:
        return PairedRatio(metric, 0, None, None, None, None, None, decision="too few", orders=said)
    d = [math.log(y / x) for x, y in zip(a, b)]
    if n < MIN_ITEMS:
        return PairedRatio(metric, n, math.exp(float(np.mean(d))), None, None, None, None, decision="too few",
                           orders=said)
    e = estimate(d, orders)
    ratio, median_a = math.exp(e.log_ratio), float(np.median(a))
    return _decide(PairedRatio(
        metric, n, ratio, math.exp(e.lo), math.exp(e.hi), None,
        None if detect_alpha is None else items_to_detect(e.sd, alpha=detect_alpha),
        e.method, e.p, e.p, order_effect=None if e.order_effect is None else math.exp(e.order_effect),
        orders=said, difference=median_a * (ratio - 1),
        practical=beyond_floors(metric, median_a, median_a * ratio), sd=e.sd))


def _decide(p: PairedRatio) -> PairedRatio:
    """The decision from the corrected p-value, the floors and the metric's direction."""
    if p.lo is None:
        return replace(p, decision="too few", winner=None)
    if not p.decided:
        return replace(p, decision="no difference", winner=None)
    if not p.practical:
        return replace(p, decision="no practical difference", winner=None)
    better = METRICS[p.metric].better if p.metric in METRICS else ""
    if not better:
        return replace(p, decision="different", winner=None)
    return replace(p, decision="winner", winner="B" if (p.ratio > 1) == (better == "higher") else "A")


def in_family(p: PairedRatio) -> bool:
    """Whether a metric counts in the correction: it has a p-value that chance could have moved (one equal
    in every item, e.g. the output length of a lossless toggle, is no test)."""
    return p.p is not None and not (p.method == "exact" and p.ratio == 1.0)


def paired_table(rows: list[dict], metrics: list[str] = PAIRED_METRICS, key=("item", "turn")
                 ) -> list[PairedRatio]:
    """One PairedRatio per metric that has at least one item on both sides, its decision corrected
    across the table (Holm over the metrics `in_family`) and its items-for-5% at the strictest
    corrected α (ALPHA / those metrics)."""
    data = [(m, *paired_values(rows, m, key)) for m in metrics]
    data = [x for x in data if x[1]]
    table = [paired_ratio(m, a, b, o, detect_alpha=None) for m, a, b, o in data]
    family = [in_family(p) for p in table]
    adjusted = holm([p.p if f else None for p, f in zip(table, family)])
    detect_alpha = ALPHA / max(1, sum(family))
    return [_decide(replace(p, p_holm=p.p if q is None else q, items_to_detect=items_to_detect(p.sd, alpha=detect_alpha)
                            if f else None)) for p, q, f in zip(table, adjusted, family)]


# --- words ------------------------------------------------------------------------------------
def fmt_ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x" if v >= 0.1 else f"{v:.3f}x"


def bound_text(v: float) -> str:
    """An interval's bound to 2 decimals, more where 2 would round it onto 1.00 from either side: an
    interval that excludes 1 (a test of that metric alone passed) never reads as one that holds it."""
    for digits in range(2, 7):
        s = f"{v:.{digits}f}"
        if v == 1 or float(s) != 1:
            return s
    return s


def interval_text(p: PairedRatio) -> str:
    if p.lo is None:
        return "—"
    return f"{bound_text(p.lo)}–{bound_text(p.hi)}"


def p_text(v: float | None) -> str:
    return "—" if v is None else f"< {P_SHOWN:g}" if v < P_SHOWN else f"{v:.2g}" if v < 0.01 else f"{v:.2f}"


def floors_text(metric: str) -> str:
    """"2% / 1 ms": the metric's floors as the page states them."""
    rel, absolute = METRICS[metric].floors if metric in METRICS else (0.0, 0.0)
    unit = METRICS[metric].unit if metric in METRICS else ""
    shown = f"{absolute:g} {unit}".strip() if unit != "%" else f"{100 * absolute:g} points"
    return f"{100 * rel:g}%" + (f" / {shown}" if absolute else "")


def decision_text(p: PairedRatio) -> str:
    """'B' / 'A' / 'no difference detected (n = 8)' / 'no practical difference (inside 2% / 1 ms)' /
    'higher in B (no better side)' / 'too few items to decide (n = 2; needs 3)'."""
    if p.decision == "too few":
        return f"too few items to decide (n = {p.n}; needs {MIN_ITEMS})"
    if p.decision == "winner":
        return p.winner or ""
    if p.decision == "no practical difference":
        return f"no practical difference (inside {floors_text(p.metric)})"
    if p.decision == "different":
        return f"{'higher' if p.ratio > 1 else 'lower'} in B (no better side)"
    if p.p is not None and p.p <= ALPHA:
        return f"no difference detected after correction (n = {p.n}; Holm p = {p_text(p.p_holm)})"
    return f"no difference detected (n = {p.n})"
