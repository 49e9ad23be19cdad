"""Repeated A/B runs of one prompt, paired: every earlier pair in this tab with the same prompt and
the same two configs as the latest, each run an item of ui/stats.py's paired bootstrap, with the
replies check and the verdict (as the Sweep shows them). One pair alone decides nothing: the page
says how many runs an interval needs.
"""

from __future__ import annotations

import html

from . import replies, stats, verdict
from .chat import ChatStore, Reply
from .glossary import METRICS, hover


def token_ids(store: ChatStore, session: str, reply: Reply) -> list[int] | None:
    """The reply's token ids exactly as generated (its conversation keeps them), None if gone."""
    pane = store.pane(session, reply.pane)
    return next((m.token_ids for m in pane.conversation.messages if m.timeline is reply.timeline), None)


def repeated_pairs(store: ChatStore, session: str, a: Reply, b: Reply) -> list[tuple[Reply, Reply]]:
    """(A, B) pairs of this session with `a`'s prompt and settings and `b`'s, in order, the latest last."""
    def same(r: Reply, like: Reply) -> bool:
        return r.prompt == like.prompt and r.settings == like.settings and r.timeline.finish_reason in ("stop", "length")

    side_a = [r for r in store.replies(session, "A") if same(r, a)]
    side_b = [r for r in store.replies(session, "B") if same(r, b)]
    return list(zip(side_a, side_b))


def repeated_report(store: ChatStore, session: str, a: Reply, b: Reply, decode=None) -> dict:
    pairs = repeated_pairs(store, session, a, b)
    rows, compared = [], []
    for i, (ra, rb) in enumerate(pairs, start=1):
        rows += [{**ra.row(), "item": i, "turn": 1}, {**rb.row(), "item": i, "turn": 1}]
        compared.append((i, {"token_ids": token_ids(store, session, ra), "reply": ra.text},
                         {"token_ids": token_ids(store, session, rb), "reply": rb.text}))
    table = stats.paired_table(rows)
    same = replies.summarize(compared, a.settings, b.settings, decode,
                             [r.get("compute_dtype") for r in rows]) if compared else None
    return {"runs": len(pairs), "paired": table, "replies": same,
            "verdict": verdict.verdict(table, same) if len(pairs) >= 2 else ""}


def repeated_html(store: ChatStore, session: str, a: Reply, b: Reply, decode=None) -> str:
    """Under the A/B table: the paired intervals over this prompt's repeated runs (or how to get them)."""
    rep = repeated_report(store, session, a, b, decode)
    esc = html.escape
    if rep["runs"] < 2:
        return ('<p class="lab-muted lab-repeat-note">One pair decides nothing on a shared machine: run the same '
                'prompt again (same settings) for a 95% interval per metric over the runs.</p>')
    trs = "".join(
        f'<tr><th title="{esc(hover(p.metric))}">{esc(METRICS[p.metric].label)}</th><td>{stats.fmt_ratio(p.ratio)}</td>'
        f'<td class="lab-ci">{stats.interval_text(p)}</td><td>{esc(stats.decision_text(p))}</td>'
        f'<td>{"—" if p.items_to_detect is None else f"{p.items_to_detect:,}"}</td></tr>'
        for p in rep["paired"])
    head = "".join(f'<th title="{esc(hover(k))}">{esc(METRICS[k].label)}</th>'
                   for k in ("ab_ratio", "ab_ratio_ci", "ab_decision", "items_to_detect_5pct"))
    return (f'<h4 class="lab-h">Over {rep["runs"]} runs of this prompt</h4>'
            f'<p class="lab-verdict lab-repeat-verdict"><b>Verdict.</b> {esc(rep["verdict"])}</p>'
            f'<table class="lab-table lab-paired"><thead><tr><th>metric</th>{head}</tr></thead><tbody>{trs}</tbody>'
            '</table><p class="lab-muted">Each run an item: paired bootstrap over the runs (scipy.stats.bootstrap, '
            'seeded); a winner only where the interval excludes 1.</p>')
