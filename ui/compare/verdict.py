"""An A/B comparison in words, built only from the paired figures (ui/compare/stats.py) and the replies check
(ui/compare/replies.py): one sentence that names the headline metrics (declared in ui/shell/glossary.py), the
paired table every comparison shows (the Sweep, the A/B tab's repeated pairs, the Load tab) and the
one line that states how it decides. E.g. "B cuts TPOT to 0.55x (0.50–0.61) and total (server) to
0.60x (0.55–0.66); no difference detected in TTFT (server) (0.96–1.05); 8 items, order
counterbalanced; 8 of 8 replies identical." Pure functions.
"""

from __future__ import annotations

import html

from ..shell.glossary import METRICS, floors_line, hover
from .replies import RepliesSummary, sentence
from .stats import (ALPHA, CONFIDENCE, MIN_ITEMS, PairedRatio, decision_text, floors_text, fmt_ratio, in_family,
                    interval_text, p_text)

HEADLINE = tuple(name for name, m in METRICS.items() if m.headline)  # the metrics the sentence names, in order
COLUMNS = ("ab_ratio", "ab_ratio_ci", "ab_p_holm", "ab_decision", "items_to_detect_5pct")


def _label(p: PairedRatio) -> str:
    return METRICS[p.metric].label if p.metric in METRICS else p.metric


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def order_words(table: list[PairedRatio], first: str = "A") -> str:
    """'order counterbalanced' / 'A always first' (the order was not counterbalanced: confounded)."""
    orders = next((p.orders for p in table if p.n), "")
    if not orders or orders.endswith("only"):
        return f"{first} always first" if orders.startswith("AB") else (
            "B always first" if orders.startswith("BA") else "order unknown")
    return "order counterbalanced"


def verdict(table: list[PairedRatio], replies: RepliesSummary | None = None, who: str = "B",
            first: str = "A") -> str:
    """The sentence over the headline metrics; "" when none was paired."""
    by = {p.metric: p for p in table}
    picked = [by[m] for m in HEADLINE if m in by]
    if not picked:
        return ""
    moved = [p for p in picked if p.decision in ("winner", "different")]
    parts = []
    if moved:
        clauses, verb = [], ""
        for p in moved:
            v = "cuts" if p.ratio < 1 else "raises"
            clauses.append(f"{'' if v == verb else v + ' '}{_label(p)} to {fmt_ratio(p.ratio)} ({interval_text(p)})")
            verb = v
        parts.append(f"{who} " + " and ".join(clauses))
    flat = [p for p in picked if p.decision == "no practical difference"]
    if flat:
        parts.append("no practical difference in " + _either(
            [f"{_label(p)} ({fmt_ratio(p.ratio)}, inside {floors_text(p.metric)})" for p in flat]))
    none = [p for p in picked if p.decision == "no difference"]
    if none:
        parts.append("no difference detected in " + _either([f"{_label(p)} ({interval_text(p)})" for p in none]))
    few = [p for p in picked if p.decision == "too few"]
    if few:
        parts.append(f"too few items to decide on {_either([_label(p) for p in few])} (needs {MIN_ITEMS})")
    text = "; ".join(parts)
    text = text[0].upper() + text[1:]
    text += f"; {max(p.n for p in picked)} items, {order_words(table, first)}"
    tail = sentence(replies) if replies else ""
    return text + (f"; {tail}." if tail else ".")


def rule_line(table: list[PairedRatio]) -> str:
    """How the table decides, in one line: the correction and the floors."""
    tested = sum(map(in_family, table))
    return (f"A side wins only where p ≤ {ALPHA:g} after Holm's correction across the {tested} metrics tested "
            f"(family-wise α = {ALPHA:g}) and B/A moves by at least the practical floors, {floors_line()}; "
            "inside them: no practical difference.")


def method_line(table: list[PairedRatio]) -> str:
    """The estimate and its interval, in one line."""
    both = order_words(table) == "order counterbalanced"
    tested = max(1, sum(map(in_family, table)))
    return (f"B/A: the items' ratios (B over its own A), averaged in logs"
            f"{' over the two orders, so an order effect cancels' if both else ''}; {CONFIDENCE:.0%} interval: "
            f"a t-interval on log(B/A) at every size (a bootstrap covers less than it claims at these sizes: "
            f"python -m ui.compare.coverage). Items for 5%: a t-test on log(B/A) at α = {ALPHA:g}/{tested}, 80% power, "
            "at the spread seen.")


def order_line(table: list[PairedRatio], first: str = "A") -> str:
    """The order the pairs ran in, and the order effect measured (the second run against the first)."""
    p = next((p for p in table if p.order_effect is not None and p.metric in HEADLINE), None)
    words = order_words(table, first)
    if p is None:
        return f"Order: {words}" + ("" if words == "order counterbalanced" else
                                     ": an order effect cannot be told from a difference here") + "."
    return (f"Order: {p.orders} ({words}); the second run of a pair took {fmt_ratio(p.order_effect)} the first's "
            f"{_label(p)} (an order effect, removed from B/A).")


def table_html(table: list[PairedRatio], first: str = "A") -> str:
    """The paired table: B/A, its interval, the corrected p, the decision, the items a 5% difference needs."""
    esc = html.escape
    trs = []
    for p in table:
        win = ' class="lab-win"' if p.winner else ""
        star = " ★" if p.metric in HEADLINE else ""
        trs.append(f'<tr data-metric="{p.metric}"><th title="{esc(hover(p.metric))}">{esc(_label(p))}{star}</th>'
                   f'<td>{fmt_ratio(p.ratio)}</td><td class="lab-ci">{interval_text(p)}</td>'
                   f'<td>{p_text(p.p_holm)}</td><td class="lab-decision"{win}>{esc(decision_text(p))}</td>'
                   f'<td>{"—" if p.items_to_detect is None else f"{p.items_to_detect:,}"}</td></tr>')
    head = "".join(f'<th title="{esc(hover(k))}">{esc(METRICS[k].label)}</th>' for k in COLUMNS)
    return (f'<table class="lab-table lab-paired"><thead><tr><th>metric</th>{head}</tr></thead>'
            f'<tbody>{"".join(trs)}</tbody></table>'
            f'<p class="lab-rule" title="{esc(hover("practical_floor"))}">★ headline (named in the verdict). '
            f'{esc(rule_line(table))}</p><p class="lab-muted lab-method" title="{esc(hover("ab_ratio_ci"))}">'
            f'{esc(method_line(table))}</p>'
            f'<p class="lab-muted lab-order" title="{esc(hover("order_counterbalanced"))}">{esc(order_line(table, first))}</p>')
