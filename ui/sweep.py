"""Sweeps: a prompt set through config A and config B, then p50/p90 per metric and distributions.

Runs on the server (through the same `ChatStore.run_turn` as the chat), so its figures are
the server's: browser-perceived metrics come from replies streamed to a page (Chat and A/B).
A and B alternate item by item, so slow drift of a shared machine hits both alike. Each
item is one conversation per config: its history is seeded, then its turns run in order.
"""

from __future__ import annotations

import html
import json
import tempfile
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path

from engine.core.errors import InvalidRequest

from . import compare, record_view, records
from .chat import ChatStore
from .glossary import METRICS, hover

SWEEP_METRICS = ["ttft_ms", "prefill_ms", "tpot_ms", "decode_tps", "e2e_ms", "queue_ms", "cached_tokens",
                 "acceptance_rate", "output_tokens"]
PLOT_METRICS = ["ttft_ms", "tpot_ms", "e2e_ms", "decode_tps"]
SWEEP_COLUMNS = ["item", "turn", "pane", "config", "finish_reason", *SWEEP_METRICS[:-1], "prompt_tokens",
                 "output_tokens", "drafted", "accepted"]


async def run_sweep(store: ChatStore, prompt_set: dict, settings_a: dict, settings_b: dict, *,
                    max_items: int | None = None, progress: Callable[[int, int, str], None] | None = None
                    ) -> list[dict]:
    """Every turn of every item through A then B; returns one row per reply (errors included)."""
    if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1):
        raise InvalidRequest(f"max_items must be a whole number of at least 1, not {max_items!r}", "max_items")
    items = prompt_set["items"][: max_items or None]
    total = 2 * sum(len(item["turns"]) for item in items)
    session, done, rows = store.new_session(), 0, []
    for i, item in enumerate(items):
        for pane, settings in (("A", settings_a), ("B", settings_b)):
            store.seed(session, pane, item.get("history", []))
            for turn in item["turns"]:
                if progress:
                    progress(done, total, f"item {i + 1}/{len(items)}, {pane}")
                row = await _one_turn(store, session, pane, turn, settings)
                rows.append({"item": i + 1, **row})
                done += 1
                if row.get("finish_reason") in ("error", "cancelled"):
                    break  # later turns of this conversation would build on a missing reply
    if progress:
        progress(total, total, "done")
    return rows


async def _one_turn(store: ChatStore, session: str, pane: str, message: str, settings: dict) -> dict:
    try:
        async with aclosing(store.run_turn(session, pane, message, settings)) as stream:
            async for kind, data in stream:
                if kind == "done":
                    return data["row"]
                if kind == "error":
                    return {"pane": pane, "finish_reason": "error", "error": data["message"]}
    except InvalidRequest as exc:  # bad settings: every turn would fail the same way, so stop here
        raise InvalidRequest(f"config {pane}: {exc}", getattr(exc, "param", None)) from exc
    return {"pane": pane, "finish_reason": "error", "error": "the stream ended without a reply"}


def summary(rows: list[dict]) -> list[dict]:
    by = {"A": [r for r in rows if r.get("pane") == "A"], "B": [r for r in rows if r.get("pane") == "B"]}
    return compare.summary_rows(by, SWEEP_METRICS)


def summary_html(rows: list[dict]) -> str:
    """p50 and p90 of each metric for A and B, the better p50 marked."""
    labels = {r["pane"]: r["config"] for r in rows if r.get("config")}
    trs = []
    for s in summary(rows):
        name = s["metric"]
        if not s["A n"] and not s["B n"]:
            continue  # e.g. acceptance without speculation
        cells = ""
        for side in ("A", "B"):
            win = ' class="lab-win"' if s.get("winner") == side else ""
            cells += (f"<td{win}>{record_view.fmt(name, s[f'{side} p50'])}</td>"
                      f"<td>{record_view.fmt(name, s[f'{side} p90'])}</td>")
        trs.append(f'<tr><th title="{html.escape(hover(name))}">{METRICS[name].label}</th>'
                   f'{cells}<td class="lab-winner">{s.get("winner", "")}</td><td>{s["A n"]} / {s["B n"]}</td></tr>')
    errors = sum(r.get("finish_reason") == "error" for r in rows)
    note = f'<p class="lab-muted">{errors} replies failed and are left out.</p>' if errors else ""
    esc = html.escape
    return (f'<table class="lab-table lab-delta"><thead><tr><th>metric</th>'
            f'<th>A p50</th><th>A p90</th><th>B p50</th><th>B p90</th><th>winner (p50)</th><th>n (A / B)</th></tr>'
            f'<tr class="lab-sub"><th></th><th colspan="2">{esc(labels.get("A", ""))}</th>'
            f'<th colspan="2">{esc(labels.get("B", ""))}</th><th></th><th></th></tr></thead>'
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
            ys = [r.get(m) for r in rows if r.get("pane") == pane and r.get(m) is not None]
            fig.add_trace(go.Box(y=ys, name=pane, marker_color=colors[pane], boxpoints="all", jitter=0.4,
                                 pointpos=0, showlegend=False, hovertemplate=f"{pane}: %{{y:.1f}}<extra></extra>"),
                          row=1, col=col)
    fig.update_layout(height=320, margin=dict(l=30, r=10, t=70, b=30), template="plotly_white")
    return fig


def export_files(rows: list[dict], folder: Path | None = None) -> list[str]:
    folder = Path(folder or tempfile.mkdtemp(prefix="latency-lab-sweep-"))
    csv_path, json_path = folder / "sweep.csv", folder / "sweep.json"
    csv_path.write_text(records.rows_to_csv(rows, SWEEP_COLUMNS))
    json_path.write_text(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))
    return [str(csv_path), str(json_path)]
