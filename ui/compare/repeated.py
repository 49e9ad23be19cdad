"""Repeated A/B runs of one prompt, paired: every earlier pair in this tab with the same prompt and
the same two configs as the latest, each run an item of ui/compare/stats.py's paired statistics, with the
replies check and the verdict (as the Sweep shows them). The page alternates which pane runs first
(ui/compare/ab.js, stats.COUNTERBALANCE); the order of each pair is read from the server's own stamps (which
request it received first). The first pair of a prompt is a warm-up (stats.WARMUP_PAIRS): shown in the
delta table, not counted, because one-time costs land in it (a weights variant built, a compile, the
prompt's first prefill). One pair alone decides nothing: the page says how many runs an interval needs.
"""

from __future__ import annotations

import html

from . import replies, stats, verdict
from ..chat.store import ChatStore, Reply
from ..shell.glossary import hover


def repeated_pairs(store: ChatStore, session: str, a: Reply, b: Reply) -> list[tuple[Reply, Reply]]:
    """(A, B) pairs of this session with `a`'s prompt and settings and `b`'s, in order, the latest last."""
    def same(r: Reply, like: Reply) -> bool:
        return r.prompt == like.prompt and r.settings == like.settings and r.timeline.finish_reason in ("stop", "length")

    side_a = [r for r in store.replies(session, "A") if same(r, a)]
    side_b = [r for r in store.replies(session, "B") if same(r, b)]
    return list(zip(side_a, side_b))


def order(a: Reply, b: Reply) -> str:
    """"AB" where the server received A's request first, else "BA"."""
    return "AB" if a.timeline.received_ns <= b.timeline.received_ns else "BA"


def repeated_report(store: ChatStore, session: str, a: Reply, b: Reply, decode=None) -> dict:
    pairs = repeated_pairs(store, session, a, b)
    rows, compared = [], []
    for i, (ra, rb) in enumerate(pairs):
        extra = {"item": i, "turn": 1, "order": order(ra, rb), **({"warmup": True} if i < stats.WARMUP_PAIRS else {})}
        rows += [{**ra.row(), **extra}, {**rb.row(), **extra}]
        if i >= stats.WARMUP_PAIRS:
            compared.append((i, {"token_ids": store.token_ids(session, ra), "reply": ra.text},
                             {"token_ids": store.token_ids(session, rb), "reply": rb.text}))
    counted = len(pairs) - min(len(pairs), stats.WARMUP_PAIRS)
    table = stats.paired_table(rows) if counted else []
    same = replies.summarize(compared, a.settings, b.settings, decode,
                             [r.get("compute_dtype") for r in rows]) if compared else None
    return {"runs": len(pairs), "counted": counted, "paired": table, "replies": same, "rows": rows,
            "verdict": verdict.verdict(table, same) if counted >= stats.MIN_ITEMS else ""}


def repeated_html(store: ChatStore, session: str, a: Reply, b: Reply, decode=None) -> str:
    """Under the A/B table: the paired intervals over this prompt's repeated runs (or how to get them)."""
    rep = repeated_report(store, session, a, b, decode)
    esc = html.escape
    need = stats.WARMUP_PAIRS + stats.MIN_ITEMS
    if rep["counted"] < stats.MIN_ITEMS:
        return (f'<p class="lab-muted lab-repeat-note" title="{esc(hover("warmup_pair"))}">One pair decides nothing '
                f'on a shared machine: run the same prompt again (same settings). The first run is a warm-up, not '
                f'counted; an interval per metric needs {stats.MIN_ITEMS} more ({need} runs; {rep["runs"]} so far). '
                f'The page alternates which pane runs first (AB, BA, BA, AB, …).</p>')
    return (f'<h4 class="lab-h">Over {rep["runs"]} runs of this prompt (the first a warm-up, not counted)</h4>'
            f'<p class="lab-verdict lab-repeat-verdict"><b>Verdict.</b> {esc(rep["verdict"])}</p>'
            f'{verdict.table_html(rep["paired"])}')
