"""Two configs compared: which side wins a metric, the A/B delta table and the notes under it,
and the percentiles per config a sweep summarizes. Pure functions: no engine, no Gradio.
"""

from __future__ import annotations

import html
import statistics

from ..chat import network
from ..shell.glossary import METRICS, hover
from ..chat.record_view import fmt, metric_label
from ..chat.records import row
from .stats import beyond_floors

DELTA_METRICS = ["ttft_ms", "client_ttft_ms", "tpot_ms", "e2e_ms", "client_e2e_ms", "decode_tps",
                 "prefill_ms", "prefill_tps", "cached_tokens", "acceptance_rate", "weight_mb", "decode_mb_per_token",
                 "prefill_tflops", "prefill_compute_fraction", "decode_gbps", "decode_bandwidth_fraction",
                 "client_first_word_ms",
                 "paint_gap_cv", "paint_gap_max_ms", "reader_wait_ms", "smoothing_hold_ms"]


def winner(name: str, a, b) -> str:
    """The better side of a metric in one pair: A, B, tie (inside the metric's practical floors,
    ui/shell/glossary.py: one pair on a shared machine, and the same floors as every A/B verdict, ui/compare/stats.py),
    or "" (no direction for this metric, or a figure is missing)."""
    m = METRICS.get(name)
    if m is None or not m.better or a is None or b is None:
        return ""
    if not beyond_floors(name, a, b):
        return "tie"
    a_wins = a < b if m.better == "lower" else a > b
    return "A" if a_wins else "B"


def delta_rows(a: dict, b: dict, metrics: list[str] = DELTA_METRICS) -> list[dict]:
    out = []
    for name in metrics:
        va, vb = a.get(name), b.get(name)
        if va is None and vb is None:
            continue
        out.append({"metric": name, "a": va, "b": vb,
                    "delta": None if va is None or vb is None else vb - va,
                    "ratio": vb / va if va and vb is not None else None,
                    "winner": winner(name, va, vb)})
    return out


def delta_html(deltas: list[dict], label_a: str = "A", label_b: str = "B") -> str:
    trs = []
    for d in deltas:
        name = d["metric"]
        cells = []
        for side in ("a", "b"):
            mark = ' class="lab-win"' if d["winner"] == side.upper() else ""
            cells.append(f"<td{mark}>{html.escape(fmt(name, d[side]))}</td>")
        delta = "—" if d["delta"] is None else ("+" if d["delta"] > 0 else "") + fmt(name, d["delta"])
        ratio = "—" if d["ratio"] is None else f"{d['ratio']:.2f}×"
        win = {"A": "A", "B": "B", "tie": "tie", "": ""}[d["winner"]]
        trs.append(f'<tr><th title="{html.escape(hover(name))}">{html.escape(metric_label(name))}</th>'
                   f'{"".join(cells)}<td>{html.escape(delta)}</td><td>{ratio}</td>'
                   f'<td class="lab-winner">{win}</td></tr>')
    return ('<table class="lab-table lab-delta"><thead><tr><th>metric</th>'
            f"<th>A: {html.escape(label_a)}</th><th>B: {html.escape(label_b)}</th>"
            f'<th>B − A</th><th>B / A</th><th>winner</th></tr></thead><tbody>{"".join(trs)}</tbody></table>')


def replies_note(a: dict, b: dict) -> str:
    """One line under the A/B table: do the two replies say the same thing, and if not, where they
    part and the likely reason. Greedy text can legitimately differ between configs: quantized
    weights are other numbers, and in bf16 a speculative verify pass (several rows through one GEMM)
    rounds near-ties differently from one-row steps (docs/speculative.md, "Exactness in bf16"); a compiled
    step's fused kernels round in their own order (docs/compiled-step.md, "Exactness")."""
    ta, tb = a.get("reply") or "", b.get("reply") or ""
    if ta == tb:
        return "The two replies are identical." if ta else ""
    at = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    sa, sb = a.get("settings") or {}, b.get("settings") or {}
    if sa.get("temperature") or sb.get("temperature"):
        why = "sampling (temperature > 0) draws different tokens"
    elif (sa.get("quantization") or "") != (sb.get("quantization") or ""):
        why = "different weights give different greedy choices"
    elif sa.get("speculative", "off") != sb.get("speculative", "off"):
        why = ("both are greedy: speculation verifies several tokens in one multi-row matmul, which in bf16 rounds "
               "near-ties differently from one-token steps (exact in fp32; see docs/speculative.md, Exactness in bf16)")
    elif bool(sa.get("compiled_decode")) != bool(sb.get("compiled_decode")):
        why = ("both are greedy: the compiled step's fused kernels round in their own order, close to the eager "
               "step's but not bit for bit (engine info gives its top-1 agreement; docs/compiled-step.md, Exactness)")
    else:
        why = "the configs differ in more than sampling, or the conversations differ"
    return f"The replies part after {at:,} characters: {why}."


def transport_lesson(a: dict, b: dict) -> str:
    """A sentence under the A/B table, in the measured numbers, when the panes differ in what the
    network or streaming does (the server's figures should match; the browser's should not)."""
    sa, sb = a.get("settings") or {}, b.get("settings") or {}
    ra, rb = row(a), row(b)

    def ms(r, key):
        v = r.get(key)
        return "—" if v is None else f"{v:,.0f} ms"

    server = f"Server TTFT A {ms(ra, 'ttft_ms')}, B {ms(rb, 'ttft_ms')}"
    if sa.get("streaming", True) != sb.get("streaming", True):
        off, r = ("B", rb) if not sb.get("streaming", True) else ("A", ra)
        return (f"{server}: the engine's work is the same. With streaming off, {off}'s first word was painted at "
                f"{ms(r, 'client_first_word_ms')}, against a total of {ms(r, 'client_e2e_ms')}: its reader waited "
                "for the whole reply.")
    if (sa.get("network") or "loopback") != (sb.get("network") or "loopback"):
        ga = None if ra.get("transport_overhead_ms") is None else ra["transport_overhead_ms"]
        gb = None if rb.get("transport_overhead_ms") is None else rb["transport_overhead_ms"]
        added = "—" if ga is None or gb is None else f"{gb - ga:+,.0f} ms"
        return (f"{server}: the engine's work is the same. Browser TTFT A {ms(ra, 'client_ttft_ms')}, "
                f"B {ms(rb, 'client_ttft_ms')}: B's network adds {added} to the first token (simulated: "
                f"{network.link_for(sb).describe()}; one round trip is twice the one-way delay).")
    return ""


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of the values that are present."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if 0 < q < 100 else (
        xs[0] if q <= 0 else xs[-1])


def summary_rows(rows_by_config: dict[str, list[dict]], metrics: list[str]) -> list[dict]:
    """p50/p90 of each metric for each config (e.g. {'A': rows, 'B': rows}), with the p50 winner."""
    out = []
    names = list(rows_by_config)
    for m in metrics:
        entry = {"metric": m}
        for name in names:
            vals = [r.get(m) for r in rows_by_config[name]]
            entry[f"{name} p50"] = percentile(vals, 50)
            entry[f"{name} p90"] = percentile(vals, 90)
            entry[f"{name} n"] = sum(v is not None for v in vals)
        if len(names) == 2:
            entry["winner"] = winner(m, entry[f"{names[0]} p50"], entry[f"{names[1]} p50"])
            if entry["winner"] in ("A", "B"):
                entry["winner"] = names[0] if entry["winner"] == "A" else names[1]
        out.append(entry)
    return out
