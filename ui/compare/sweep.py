"""Sweeps: a prompt set through config A and config B, then p50/p90 per metric, distributions and the
paired statistics (ui/compare/stats.py) with their verdict (ui/compare/verdict.py).

Runs on the server (through the same `ChatStore.run_turn` as the chat), so its figures are
the server's: browser-perceived metrics come from replies streamed to a page (Chat and A/B).
Each item is one conversation per config: its history is seeded, then its turns run in order, A's
and B's back to back, so slow drift of a shared machine hits both alike. Which config runs first
alternates item by item (stats.COUNTERBALANCE, ABBA), recorded per row as `order` (the item's) and
`position` (1: ran first), so what the first run of an item warms up helps A and B alike. A warm-up
pair runs first (the set's first item, `warmup: true`, item 0): shown in the export, not counted,
because one-time costs land in it (a weights variant built, a compile, first-touch memory).
"""

from __future__ import annotations

import html
import json
import tempfile
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path

from engine.core.errors import InvalidRequest

from . import delta, replies, stats, verdict
from ..chat import record_view, records
from ..chat.store import ChatStore
from ..shell.glossary import METRICS, hover
from ..chat.settings import PaneSettings

SWEEP_METRICS = ["ttft_ms", "prefill_ms", "tpot_ms", "decode_tps", "e2e_ms", "queue_ms", "cached_tokens",
                 "acceptance_rate", "output_tokens"]
PLOT_METRICS = ["ttft_ms", "tpot_ms", "e2e_ms", "decode_tps"]
SWEEP_COLUMNS = ["item", "turn", "pane", "order", "position", "warmup", "config", "finish_reason",
                 *SWEEP_METRICS[:-1], "prompt_tokens", "output_tokens", "drafted", "accepted"]


def same_on_server(settings_a: dict, settings_b: dict) -> bool:
    """A and B ask the server for the same thing (they may differ in the page's own settings, network
    or smoothing, which a sweep does not apply): the sweep is then an A/A check."""
    try:
        return PaneSettings.read(settings_a).asks_server() == PaneSettings.read(settings_b).asks_server()
    except InvalidRequest:
        return False


def _plan(items: list[dict]) -> list[tuple[int, dict, str]]:
    """(item number, item, order): the warm-up pair (item 0: the first item again), then every item
    in the counterbalanced order."""
    warm = [(0, items[0], "AB")] * stats.WARMUP_PAIRS if items else []
    return warm + [(i + 1, item, stats.pair_order(i)) for i, item in enumerate(items)]


async def run_sweep(store: ChatStore, prompt_set: dict, settings_a: dict, settings_b: dict, *,
                    max_items: int | None = None, progress: Callable[[int, int, str], None] | None = None
                    ) -> list[dict]:
    """Every turn of every item through A and B, in the counterbalanced order, after a warm-up pair;
    returns one row per reply (errors included)."""
    if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1):
        raise InvalidRequest(f"max_items must be a whole number of at least 1, not {max_items!r}", "max_items")
    settings = {"A": settings_a, "B": settings_b}
    read = {pane: _read(pane, values, store) for pane, values in settings.items()}  # once per config
    plan = _plan(prompt_set["items"][: max_items or None])
    total = 2 * sum(len(item["turns"]) for _, item, _ in plan)
    # the warm-up in a session of its own: its prefix cache scope is not the counted items'
    warm_session, session, done, rows = store.new_session(), store.new_session(), 0, []
    counted = len(plan) - stats.WARMUP_PAIRS
    for number, item, order in plan:
        where = warm_session if number == 0 else session
        for position, pane in enumerate(order, start=1):
            store.seed(where, pane, item.get("history", []))
            for turn in item["turns"]:
                if progress:
                    what = "warm-up" if number == 0 else f"item {number}/{counted}"
                    progress(done, total, f"{what}, {pane} ({order})")
                row = await _one_turn(store, where, pane, turn, read[pane])
                if row.get("finish_reason") not in ("error", "cancelled"):  # the reply as generated, for ui/compare/replies.py
                    last = store.pane(where, pane).conversation.messages[-1]
                    row = {**row, "reply": last.content, "token_ids": last.token_ids, "settings": settings[pane]}
                rows.append({"item": number, **row, "order": order, "position": position,
                             **({"warmup": True} if number == 0 else {})})
                done += 1
                if row.get("finish_reason") in ("error", "cancelled"):
                    break  # later turns of this conversation would build on a missing reply
    if progress:
        progress(total, total, "done")
    return rows


def _read(pane: str, values: dict, store: ChatStore) -> PaneSettings:
    try:
        return PaneSettings.read(values, list(store.engines))
    except InvalidRequest as exc:  # bad settings: every turn would fail the same way, so stop here
        raise InvalidRequest(f"config {pane}: {exc}", getattr(exc, "param", None)) from exc


async def _one_turn(store: ChatStore, session: str, pane: str, message: str, settings: PaneSettings) -> dict:
    try:
        async with aclosing(store.run_turn(session, pane, message, settings)) as stream:
            async for kind, data in stream:
                if kind == "done":
                    return data["row"]
                if kind == "error":
                    return {"pane": pane, "finish_reason": "error", "error": data["message"]}
    except InvalidRequest as exc:  # the conversation itself refused (a turn still streaming): said per config
        raise InvalidRequest(f"config {pane}: {exc}", getattr(exc, "param", None)) from exc
    return {"pane": pane, "finish_reason": "error", "error": "the stream ended without a reply"}


def counted(rows: list[dict]) -> list[dict]:
    """The rows the figures count: no warm-up pair."""
    return [r for r in rows if not r.get("warmup")]


def summary(rows: list[dict]) -> list[dict]:
    """p50/p90 per metric and config; no winner here: that takes an interval (`paired`)."""
    rows = counted(rows)
    by = {"A": [r for r in rows if r.get("pane") == "A"], "B": [r for r in rows if r.get("pane") == "B"]}
    return [{k: v for k, v in s.items() if k != "winner"} for s in delta.summary_rows(by, SWEEP_METRICS)]


def paired(rows: list[dict]) -> list[stats.PairedRatio]:
    """Per metric, B/A with its 95% interval over the items, decided (ui/compare/stats.py)."""
    return stats.paired_table([r for r in counted(rows) if r.get("finish_reason") not in ("error", "cancelled")])


def replies_summary(rows: list[dict], decode=None) -> replies.RepliesSummary | None:
    """Identical replies and where they part, item by item (ui/compare/replies.py)."""
    rows = counted(rows)
    by = {(r["item"], r.get("turn"), r["pane"]): r for r in rows if "token_ids" in r}
    pairs = [(f"{item}" + (f".{turn}" if turn and turn > 1 else ""), r, by[(item, turn, "B")])
             for (item, turn, pane), r in by.items() if pane == "A" and (item, turn, "B") in by]
    if not pairs:
        return None
    settings = {p: next(r["settings"] for r in rows if r.get("pane") == p and "settings" in r) for p in ("A", "B")}
    return replies.summarize(pairs, settings["A"], settings["B"], decode,
                             [r.get("compute_dtype") for r in rows if "token_ids" in r])


def is_aa(rows: list[dict]) -> bool:
    """Whether A and B ran the same server settings (an A/A check)."""
    s = {p: next((r["settings"] for r in rows if r.get("pane") == p and "settings" in r), None) for p in ("A", "B")}
    return None not in s.values() and same_on_server(s["A"], s["B"])


def report(rows: list[dict], decode=None) -> dict:
    """What the API returns beside the rows: p50/p90, the paired intervals, the replies, the verdict,
    and how it was run and decided."""
    table, same = paired(rows), replies_summary(rows, decode)
    return {"summary": summary(rows), "paired": [p.to_dict() for p in table],
            "replies": same.to_dict() if same else None, "verdict": verdict.verdict(table, same),
            "aa": is_aa(rows), "design": {"order": "".join(o[0] for o in stats.COUNTERBALANCE), "warmup_pairs": stats.WARMUP_PAIRS,
                                          "items": len({r["item"] for r in counted(rows)})},
            "decision": {"alpha": stats.ALPHA, "correction": "holm", "confidence": stats.CONFIDENCE,
                         "interval": "t on log(B/A), order-adjusted", "min_items": stats.MIN_ITEMS,
                         "floors": {p.metric: dict(zip(("relative", "absolute"), METRICS[p.metric].floors))
                                    for p in table if p.metric in METRICS}}}


AA_NOTE = ("A and B ask the server for the same thing (they may differ only in network, streaming or smoothing, "
           "which the Sweep does not apply): this is an A/A check. Every metric should read \"no difference\"; "
           "a winner here is a false positive (by design at most {alpha:.0%} of A/A checks), and says the machine "
           "or the number of items is not yet enough to trust an A/B.")


def paired_html(rows: list[dict], decode=None) -> str:
    """The verdict, the replies line, the A/A note, the paired table and how it decides."""
    table, same = paired(rows), replies_summary(rows, decode)
    if not table:
        return ""
    esc = html.escape
    same_line = (f'<p class="lab-replies-line" title="{esc(hover("identical_replies"))}">Replies: '
                 f'{esc(replies.sentence(same))}.</p>') if same else ""
    aa = (f'<p class="lab-aa-note" title="{esc(hover("aa_check"))}"><b>A/A check.</b> '
          f'{esc(AA_NOTE.format(alpha=stats.ALPHA))}</p>') if is_aa(rows) else ""
    warm = sum(1 for r in rows if r.get("warmup") and r.get("pane") == "A")
    warm_line = (f'<p class="lab-muted" title="{esc(hover("warmup_pair"))}">A warm-up pair ran first (the first '
                 'item, A then B): in the export, not counted.</p>') if warm else ""
    return (f'<p class="lab-verdict"><b>Verdict.</b> {esc(verdict.verdict(table, same))}</p>{same_line}{aa}'
            f'{verdict.table_html(table)}{warm_line}')


def summary_html(rows: list[dict], decode=None) -> str:
    """The verdict and paired intervals, then p50 and p90 of each metric for A and B."""
    labels = {r["pane"]: r["config"] for r in rows if r.get("config")}
    trs = []
    for s in summary(rows):
        name = s["metric"]
        if not s["A n"] and not s["B n"]:
            continue  # e.g. acceptance without speculation
        cells = "".join(f"<td>{record_view.fmt(name, s[f'{side} p50'])}</td>"
                        f"<td>{record_view.fmt(name, s[f'{side} p90'])}</td>" for side in ("A", "B"))
        trs.append(f'<tr><th title="{html.escape(hover(name))}">{METRICS[name].label}</th>'
                   f'{cells}<td>{s["A n"]} / {s["B n"]}</td></tr>')
    errors = sum(r.get("finish_reason") == "error" for r in counted(rows))
    note = f'<p class="lab-muted">{errors} replies failed and are left out.</p>' if errors else ""
    esc = html.escape
    return (paired_html(rows, decode) + f'<table class="lab-table lab-delta"><thead><tr><th>metric</th>'
            f'<th>A p50</th><th>A p90</th><th>B p50</th><th>B p90</th><th>n (A / B)</th></tr>'
            f'<tr class="lab-sub"><th></th><th colspan="2">{esc(labels.get("A", ""))}</th>'
            f'<th colspan="2">{esc(labels.get("B", ""))}</th><th></th></tr></thead>'
            f'<tbody>{"".join(trs)}</tbody></table>{note}')


def distributions_figure(rows: list[dict], metrics: list[str] = PLOT_METRICS):
    """Box plots with every point shown, A and B side by side, one panel per metric (Plotly)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    titles = [f"{METRICS[m].label} [{METRICS[m].unit}]" for m in metrics]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles, horizontal_spacing=0.06)
    colors = {"A": "#6366f1", "B": "#f59e0b"}
    for col, m in enumerate(metrics, start=1):
        for pane in ("A", "B"):
            ys = [r.get(m) for r in counted(rows) if r.get("pane") == pane and r.get(m) is not None]
            fig.add_trace(go.Box(y=ys, name=pane, marker_color=colors[pane], boxpoints="all", jitter=0.4,
                                 pointpos=0, showlegend=False, hovertemplate=f"{pane}: %{{y:.1f}}<extra></extra>"),
                          row=1, col=col)
    fig.update_layout(height=320, margin=dict(l=30, r=10, t=70, b=30), template="plotly_white")
    return fig


def export_files(rows: list[dict], folder: Path | None = None) -> list[str]:
    folder = Path(folder or tempfile.mkdtemp(prefix="latency-lab-sweep-"))
    csv_path, json_path = folder / "sweep.csv", folder / "sweep.json"
    csv_path.write_text(records.rows_to_csv(rows, SWEEP_COLUMNS))
    json_path.write_text(json.dumps({"rows": rows, **report(rows)}, indent=1))
    return [str(csv_path), str(json_path)]
