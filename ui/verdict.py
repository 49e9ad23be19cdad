"""One sentence that says what B did, built only from the paired figures (ui/stats.py) and the
replies check (ui/replies.py), e.g. "B cuts TTFT to 0.42x (0.39–0.45, 20 items) and shows no
difference in TPOT (0.98–1.03; 31 items would detect 5%); 20 of 20 replies identical."
A metric gets a direction only where its interval excludes 1. Pure functions.
"""

from __future__ import annotations

from .glossary import METRICS
from .replies import RepliesSummary, sentence
from .stats import PairedRatio, fmt_ratio, interval_text

HEADLINE = ("ttft_ms", "tpot_ms", "e2e_ms")  # the figures the sentence names, in order


def clause(p: PairedRatio, first: bool) -> str:
    name = METRICS[p.metric].label if p.metric in METRICS else p.metric
    n = f", {p.n} items" if first else ""
    if p.lo is None:
        return f"has too few items for an interval on {name} (n = {p.n})"
    if p.decided:
        verb = "cuts" if p.hi < 1 else "raises"
        return f"{verb} {name} to {fmt_ratio(p.ratio)} ({interval_text(p)}{n})"
    need = f"; {p.items_to_detect:,} items would detect 5%" if p.items_to_detect else ""
    return f"shows no difference in {name} ({interval_text(p)}{n}{need})"


def verdict(table: list[PairedRatio], replies: RepliesSummary | None = None, who: str = "B") -> str:
    """The sentence; "" when nothing was paired."""
    by = {p.metric: p for p in table}
    picked = [by[m] for m in HEADLINE if m in by]
    if not picked:
        return ""
    # decided metrics first: what changed leads, what did not follows
    picked.sort(key=lambda p: not p.decided)
    clauses = [clause(p, i == 0) for i, p in enumerate(picked[:2])]
    if len(clauses) == 2 and not picked[0].decided and not picked[1].decided:  # "no difference in X or in Y"
        clauses[1] = clauses[1].replace("shows no difference in ", "in ", 1)
        text = f"{who} {clauses[0]} or {clauses[1]}"
    else:
        text = f"{who} " + " and ".join(clauses)
    tail = sentence(replies) if replies else ""
    return text + (f"; {tail}." if tail else ".")
