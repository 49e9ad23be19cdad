"""Per-reply records and what the page derives from them. Pure functions: no engine, no Gradio.

A *record* is one reply: `{request_id, session, pane, turn, settings, prompt, timeline}` where
`timeline` is `Timeline.to_dict()` and `timeline["client"]` holds the browser's timestamps and
the metrics joined from them (`join_client`). A *row* is the flat dict of numbers the tables,
stats lines, A/B deltas and sweeps use (`row`).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import statistics

from engine.config import TOGGLES
from engine.errors import InvalidRequest

from . import network, perceived
from .glossary import METRICS, hover
from .settings import PAGE_SETTINGS

READING_PACE_TPS = 5.3  # silent reading ~238 words/min at ~0.75 words/token (DESIGN.md)
MAX_CLIENT_CHUNKS = 100_000

# The columns of the per-conversation table and its CSV export, in order.
ROW_COLUMNS = [
    "turn", "pane", "request_id", "config", "finish_reason",
    "ttft_ms", "client_ttft_ms", "transport_overhead_ms", "tpot_ms", "decode_tps", "e2e_ms", "client_e2e_ms",
    "queue_ms", "setup_ms", "prefill_ms", "network_in_ms", "network_out_ms", "clock_bound_ms",
    "prompt_tokens", "cached_tokens", "prefill_tokens", "output_tokens",
    "drafted", "accepted", "acceptance_rate", "tokens_per_step", "quantization", "weight_mb",
    "prefill_tps", "context_tokens", "context_max", "prefill_tflops", "prefill_compute_fraction",
    "decode_gbps", "decode_bandwidth_fraction", "decode_mb_per_token", "peak_tflops", "copy_gbps",
    *perceived.METRICS, "smoothing",
]
DELTA_METRICS = ["ttft_ms", "client_ttft_ms", "tpot_ms", "e2e_ms", "client_e2e_ms", "decode_tps",
                 "prefill_ms", "prefill_tps", "cached_tokens", "acceptance_rate", "weight_mb", "decode_mb_per_token",
                 "prefill_tflops", "prefill_compute_fraction", "decode_gbps", "decode_bandwidth_fraction",
                 "client_first_word_ms",
                 "paint_gap_cv", "paint_gap_max_ms", "reader_wait_ms", "smoothing_hold_ms"]


# --- the browser's timestamps -------------------------------------------------------------------
def _numbers(raw, name: str, allow_none: bool) -> list:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_CLIENT_CHUNKS:
        raise InvalidRequest(f"client.{name} must be a list of at most {MAX_CLIENT_CHUNKS} numbers", name)
    out = []
    for v in raw:
        if v is None and allow_none:
            out.append(None)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
        else:
            raise InvalidRequest(f"client.{name} holds a value that is not a finite number: {v!r}", name)
    return out


def _number(raw, name: str):
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise InvalidRequest(f"client.{name} must be a finite number", name)
    return float(raw)


def join_client(timeline: dict, raw: dict, text: str | None = None) -> dict:
    """The browser's timestamps for one reply → `timeline["client"]` (glossary names).

    `raw`: `arrival_ms[i]` / `paint_ms[i]` per chunk, ms since the user pressed send (paint is
    None for a chunk with no text); `send_at_ms` (performance.now() at send); `clock_offset_ms`
    (server ms − browser ms) and `clock_rtt_ms` from the pings, if known. Browser intervals stay
    on the browser clock; only the cross-clock figures (network in/out) use the offset. The
    perceived metrics (ui/perceived.py) need the reply's `text` and the page's `shown_*` lists.
    """
    if not isinstance(raw, dict):
        raise InvalidRequest("client timing must be an object", "client")
    arrival = _numbers(raw.get("arrival_ms"), "arrival_ms", allow_none=False)
    paint = _numbers(raw.get("paint_ms"), "paint_ms", allow_none=True)
    tokens = _numbers(raw.get("arrival_tokens"), "arrival_tokens", allow_none=False)
    if paint and len(paint) != len(arrival) or tokens and len(tokens) != len(arrival):
        raise InvalidRequest("client.arrival_ms, paint_ms and arrival_tokens must have one entry per chunk",
                             "arrival_ms")
    send_at = _number(raw.get("send_at_ms"), "send_at_ms")
    offset = _number(raw.get("clock_offset_ms"), "clock_offset_ms")
    rtt = _number(raw.get("clock_rtt_ms"), "clock_rtt_ms")
    painted = [p for p in paint if p is not None]
    client = {
        "arrival_ms": arrival,
        "arrival_tokens": [int(n) for n in tokens],
        "paint_ms": paint,
        "send_at_ms": send_at,
        "clock_offset_ms": offset,
        "clock_bound_ms": None if rtt is None else rtt / 2,
        "client_ttft_ms": painted[0] if painted else None,
        "client_e2e_ms": max(painted) if painted else None,
        "transport": str(raw.get("transport") or "sse")[:16],
    }
    ttft = timeline.get("ttft_ms")
    client["transport_overhead_ms"] = (client["client_ttft_ms"] - ttft
                                       if client["client_ttft_ms"] is not None and ttft is not None else None)
    # Cross-clock: where the server's events fall on the browser's axis (ms since send).
    received = server_to_client_ms(timeline, 0.0, client)
    client["network_in_ms"] = received
    if received is not None and ttft is not None and client["client_ttft_ms"] is not None:
        client["network_out_ms"] = client["client_ttft_ms"] - (received + ttft)
    else:
        client["network_out_ms"] = None
    # Paint lag: the last painted text against the server time of the token that carried it (a
    # final end-of-sequence chunk has no text, so the last *token* is the wrong reference).
    token_ms = timeline.get("token_ms") or []
    last = max((i for i, p in enumerate(paint) if p is not None), default=None)
    client["paint_lag_ms"] = None
    if received is not None and last is not None and tokens and 0 < tokens[last] <= len(token_ms):
        client["paint_lag_ms"] = paint[last] - (received + token_ms[int(tokens[last]) - 1])
    client.update(_perceived(timeline, raw, arrival, text))
    return client


def _perceived(timeline: dict, raw: dict, arrival: list, text: str | None) -> dict:
    """The page's shown/painted text and feedback stamps, checked, and the perceived metrics."""
    shown = _numbers(raw.get("shown_ms"), "shown_ms", allow_none=False)
    chars = _numbers(raw.get("shown_chars"), "shown_chars", allow_none=False)
    painted = _numbers(raw.get("shown_paint_ms"), "shown_paint_ms", allow_none=True)
    arrival_chars = _numbers(raw.get("arrival_chars"), "arrival_chars", allow_none=False)
    if len(chars) != len(shown) or len(painted) != len(shown) or arrival_chars and len(arrival_chars) != len(arrival):
        raise InvalidRequest("client.shown_ms, shown_chars and shown_paint_ms need one entry per update, "
                             "arrival_chars one per chunk", "shown_ms")
    checked = {"shown_ms": shown, "shown_chars": chars, "shown_paint_ms": painted, "arrival_ms": arrival,
               "arrival_chars": arrival_chars, "feedback_ms": _number(raw.get("feedback_ms"), "feedback_ms"),
               "status_ms": _number(raw.get("status_ms"), "status_ms")}
    pace = _number(raw.get("reading_pace_tps"), "reading_pace_tps") or READING_PACE_TPS
    out = {"shown_ms": shown, "shown_chars": chars, "shown_paint_ms": painted, "arrival_chars": arrival_chars,
           "reading_pace_tps": pace, "smoothing": perceived.smoothing_label(raw.get("smoothing"))}
    out.update(dict.fromkeys(perceived.METRICS), client_feedback_ms=checked["feedback_ms"],
               client_status_ms=checked["status_ms"])
    if shown and text is not None:
        out.update(perceived.perceived(checked, text, int(timeline.get("output_tokens") or 0), pace))
    return out


def server_to_client_ms(timeline: dict, server_rel_ms: float | None, client: dict) -> float | None:
    """A server event (ms after `received`) on the browser's axis (ms after send), or None
    without a clock offset."""
    offset, send_at, origin_ns = client.get("clock_offset_ms"), client.get("send_at_ms"), timeline.get("received_ns")
    if server_rel_ms is None or offset is None or send_at is None or origin_ns is None:
        return None
    return origin_ns / 1e6 + server_rel_ms - offset - send_at


# --- rows --------------------------------------------------------------------------------------
def config_label(settings: dict) -> str:
    """A short human name for a config, from the toggles' declarations: 'greedy · prompt lookup · k=4 · nf4'."""
    s = settings or {}
    parts = ["greedy" if s.get("temperature") == 0 else f"T={s.get('temperature', '?')}"]
    declared = {t.name: t for t in (*TOGGLES, *PAGE_SETTINGS)}
    for t in declared.values():
        if not t.applies(s):
            continue  # k means nothing with speculation off
        label = t.describe(s.get(t.name, t.default))
        if label:
            parts.append(label)
    return " · ".join(parts)


def row(record: dict) -> dict:
    """The flat numbers of one reply. Missing figures are None (never guessed)."""
    tl = record.get("timeline") or {}
    client = tl.get("client") or {}
    r = {
        "turn": record.get("turn"),
        "pane": record.get("pane"),
        "request_id": record.get("request_id") or tl.get("request_id"),
        "config": config_label(record.get("settings") or {}),
        "quantization": (record.get("settings") or {}).get("quantization") or tl.get("quantization"),
    }
    for key in ("ttft_ms", "tpot_ms", "decode_tps", "e2e_ms", "queue_ms", "setup_ms", "prefill_ms",
                "prompt_tokens", "cached_tokens", "prefill_tokens", "output_tokens", "finish_reason",
                "queue_position", "itl_p50_ms", "itl_max_ms", "decode_ms", "prefill_tps", "context_tokens",
                "context_max", "prefill_tflops", "prefill_compute_fraction", "decode_gbps",
                "decode_bandwidth_fraction"):
        r[key] = tl.get(key)
    roof = tl.get("roofline") or {}
    r["peak_tflops"], r["copy_gbps"] = roof.get("peak_tflops"), roof.get("copy_gbps")
    r["compute_dtype"], r["limits_date"] = roof.get("compute_dtype"), roof.get("limits_date")
    per_token = tl.get("decode_bytes_per_token")
    r["decode_mb_per_token"] = per_token / 1e6 if per_token else None
    r["measured_at"] = tl.get("measured_at")  # "client": a remote engine, measured from here
    for key in ("client_ttft_ms", "client_e2e_ms", "transport_overhead_ms", "network_in_ms", "network_out_ms",
                "paint_lag_ms", "clock_bound_ms", *perceived.METRICS, "smoothing"):
        r[key] = client.get(key)
    # Feature counters arrive as timeline fields when those features are merged; absent → None.
    for key in ("drafted", "accepted", "acceptance_rate", "tokens_per_step"):
        r[key] = tl.get(key)
    if r["acceptance_rate"] is None and r["drafted"]:
        r["acceptance_rate"] = (r["accepted"] or 0) / r["drafted"]
    weight = tl.get("weight_bytes") or record.get("weight_bytes")  # the variant that served it
    r["weight_mb"] = weight / 1e6 if weight else None
    return r


# --- formatting ---------------------------------------------------------------------------------
def fmt(name: str, value) -> str:
    """A number as the page shows it: '84 ms', '27.5 tok/s', '85%', '1,380 tok'; '—' if missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if not isinstance(value, (int, float)):
        return str(value)
    unit = METRICS[name].unit if name in METRICS else ""
    if unit == "ms":
        return f"{value:,.1f} ms" if abs(value) < 10 else f"{value:,.0f} ms"
    if unit == "tok/s":
        return f"{value:,.1f} tok/s"
    if unit == "%":
        return f"{100 * value:.1f}%" if abs(value) < 0.1 else f"{100 * value:.0f}%"
    if unit == "MB":
        return f"{value:,.0f} MB" if abs(value) >= 10 else f"{value:,.2f} MB"
    if unit == "tok" and float(value).is_integer():
        return f"{int(value):,} tok"
    if unit == "tok":
        return f"{value:,.2f} tok"
    if unit == "ratio":
        return f"{value:.2f}"
    if unit == "TFLOP/s":
        return f"{value:.3g} TFLOP/s"
    if unit == "GB/s":
        return f"{value:,.1f} GB/s"
    return f"{value:,}"


def _span(name: str, text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<span{c} title="{html.escape(hover(name))}">{html.escape(text)}</span>'


def missing_reason(name: str, r: dict) -> str:
    """Why a figure is unknown ("—"): said on hover, so a missing number is never read as 0."""
    remote = r.get("measured_at") == "client"
    if name in ("prompt_tokens", "context_tokens"):
        return "the backend did not report prompt tokens" + (" (the remote server sent no usage)" if remote else "")
    if name == "context_max":
        return "the backend did not report its context window"
    if name == "prefill_tps":
        return ("a remote server's prefill is inside its TTFT: it did not report prefill time" if remote
                else "no prefill time or prefill tokens for this reply")
    if name in ("prefill_tflops", "prefill_compute_fraction", "decode_gbps", "decode_bandwidth_fraction"):
        if remote:
            return "a remote backend: its model shape, weights and machine are unknown here"
        if name == "prefill_compute_fraction" and r.get("prefill_tflops") is not None:
            return f"no measured matmul peak for {r.get('compute_dtype') or 'this dtype'} (re-measure the limits)"
        if name == "decode_bandwidth_fraction" and r.get("decode_gbps") is not None:
            return "the machine's copy bandwidth is not measured (re-measure the limits)"
        if name.startswith("decode") and (r.get("output_tokens") or 0) < 2:
            return "fewer than two output tokens: no decode step"
        return "the engine reported no model shape or weight bytes for this reply"
    return "the backend did not report it"


def _known(name: str, r: dict, text: str) -> str:
    """A stats-line figure; '—' with the reason on hover when it is None."""
    if r.get(name) is not None:
        if name.endswith("_fraction") and r[name] > 1:  # a probe that ran on a busy machine set the roof too low
            return (f'<span class="lab-over" title="{html.escape(hover(name))} — above the measured limit: the '
                    f'limits were likely measured while the machine was busy; re-measure when it is idle">'
                    f'{html.escape(text)}</span>')
        return _span(name, text)
    label = METRICS[name].label if name in METRICS else name
    return (f'<span class="lab-unknown" title="{html.escape(hover(name))} — unknown: '
            f'{html.escape(missing_reason(name, r))}">{html.escape(label)} —</span>')


def stats_line_html(r: dict) -> str:
    """The compact line under an assistant message: TTFT (server and seen), total, tok/s, prefill
    rate, tokens, context used, and each stage against the machine's limit."""
    parts = [_span("ttft_ms", f"TTFT {fmt('ttft_ms', r.get('ttft_ms'))}")]
    if r.get("client_ttft_ms") is not None:
        parts.append(_span("client_ttft_ms", f"seen {fmt('client_ttft_ms', r['client_ttft_ms'])}"))
    parts.append(_span("e2e_ms", f"total {fmt('e2e_ms', r.get('e2e_ms'))}"))
    parts.append(_span("decode_tps", fmt("decode_tps", r.get("decode_tps"))))
    parts.append(_known("prefill_tps", r, f"prefill {fmt('prefill_tps', r.get('prefill_tps'))}"))
    prompt = "—" if r.get("prompt_tokens") is None else f"{r['prompt_tokens']:,}"
    tokens = f"{prompt} → {r.get('output_tokens') or 0:,} tok"
    if r.get("cached_tokens"):
        tokens += f" ({r['cached_tokens']:,} cached)"
    parts.append(_span("output_tokens", tokens) if r.get("prompt_tokens") is not None else
                 f'<span class="lab-unknown" title="{html.escape(missing_reason("prompt_tokens", r))}">'
                 f'{html.escape(tokens)}</span>')
    ctx = "—" if r.get("context_tokens") is None else f"{r['context_tokens']:,}"
    cmax = "—" if r.get("context_max") is None else f"{r['context_max']:,}"
    known = r.get("context_tokens") is not None and r.get("context_max") is not None
    why = "" if known else " — unknown: " + missing_reason(
        "context_tokens" if r.get("context_tokens") is None else "context_max", r)
    parts.append(f'<span class="lab-context{"" if known else " lab-unknown"}" title="{html.escape(hover("context_tokens"))}'
                 f' of {html.escape(hover("context_max"))}{html.escape(why)}">context {ctx} / {cmax} tok</span>')
    parts.append(_known("prefill_compute_fraction", r,
                        f"prefill {fmt('prefill_compute_fraction', r.get('prefill_compute_fraction'))} of matmul peak"))
    parts.append(_known("decode_bandwidth_fraction", r,
                        f"decode {fmt('decode_bandwidth_fraction', r.get('decode_bandwidth_fraction'))} of bandwidth"))
    if r.get("acceptance_rate") is not None:
        parts.append(_span("acceptance_rate", f"accepted {fmt('acceptance_rate', r['acceptance_rate'])}"))
    if r.get("finish_reason") in ("cancelled", "length", "error"):
        parts.append(f'<span class="lab-finish">{html.escape(r["finish_reason"])}</span>')
    return " · ".join(parts)


def perceived_line_html(r: dict) -> str:
    """What the reader saw: first feedback, first word, how evenly words came, waits and holds."""
    if r.get("client_feedback_ms") is None and r.get("client_first_word_ms") is None:
        return ""
    parts = [_span("client_feedback_ms", f"feedback {fmt('client_feedback_ms', r.get('client_feedback_ms'))}"),
             _span("client_first_word_ms", f"first word {fmt('client_first_word_ms', r.get('client_first_word_ms'))}"),
             _span("paint_gap_cv", f"word-gap CV {fmt('paint_gap_cv', r.get('paint_gap_cv'))}"),
             _span("paint_gap_max_ms", f"longest stall {fmt('paint_gap_max_ms', r.get('paint_gap_max_ms'))}"),
             _span("reader_wait_ms", f"reader wait {fmt('reader_wait_ms', r.get('reader_wait_ms'))}")]
    if r.get("smoothing") not in (None, "off"):
        parts.append(_span("smoothing_hold_ms", f"smoothing ({r['smoothing']}) held "
                                                f"{fmt('smoothing_hold_ms', r.get('smoothing_hold_ms'))}"))
    return "perceived: " + " · ".join(parts)


def what_happened(r: dict, reading_pace: float = READING_PACE_TPS) -> str:
    """One plain sentence or three, derived only from the reply's numbers."""
    out = []
    ttft = r.get("ttft_ms")
    if ttft is not None:
        parts = {"the queue": r.get("queue_ms") or 0, "setup": r.get("setup_ms") or 0,
                 "prefill": r.get("prefill_ms") or 0}
        main = max(parts, key=parts.get)
        text = f"First token after {fmt('ttft_ms', ttft)}, mostly {main} ({fmt('ttft_ms', parts[main])}"
        if main == "prefill":
            text += f" for {r.get('prefill_tokens') or 0:,} uncached tokens"
            if r.get("cached_tokens"):
                text += f"; {r['cached_tokens']:,} were cached"
        elif main == "the queue" and r.get("queue_position"):
            n = r["queue_position"]
            text += f" behind {n} request{'s' if n != 1 else ''}"
        out.append(text + ").")
    n, tps = r.get("output_tokens") or 0, r.get("decode_tps")
    if n > 1 and tps:
        text = f"Then {n - 1:,} more tokens at {fmt('decode_tps', tps)}"
        if reading_pace:
            text += f" ({tps / reading_pace:.0f}× reading pace)"
        if r.get("drafted"):
            text += (f"; speculation: {r.get('accepted') or 0:,} of {r['drafted']:,} drafts accepted"
                     + (f", {r['tokens_per_step']:.2f} tokens per step" if r.get("tokens_per_step") else ""))
        out.append(text + ".")
    overhead = r.get("transport_overhead_ms")
    if overhead is not None:
        out.append(f"Network and paint added {fmt('transport_overhead_ms', overhead)} to the first token.")
    finish = r.get("finish_reason")
    if finish == "cancelled":
        out.append(f"Stopped after {n:,} tokens.")
    elif finish == "length":
        out.append("Reached the max tokens limit.")
    return " ".join(out)


# --- tables -----------------------------------------------------------------------------------
def table_html(rows: list[dict], columns: list[str], headers: dict | None = None) -> str:
    """A plain HTML table; every metric header carries its definition as a tooltip."""
    headers = headers or {}
    head = "".join(f'<th title="{html.escape(hover(c))}">{html.escape(headers.get(c) or _label(c))}</th>'
                   for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c, r.get(c)))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f'<table class="lab-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _label(name: str) -> str:
    m = METRICS.get(name)
    return m.label if m else name.replace("_", " ")


def rows_to_csv(rows: list[dict], columns: list[str] = ROW_COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})
    return buf.getvalue()


def records_to_json(records: list[dict]) -> str:
    return json.dumps({"records": records, "rows": [row(r) for r in records]}, indent=1)


# --- A/B and sweeps ----------------------------------------------------------------------------
def winner(name: str, a, b, tie_ratio: float = 0.03, tie_ms: float = 1.0) -> str:
    """The better side of a metric: A, B, tie (within ±3%, or 1 ms for times: noise on a shared
    machine), or "" (no direction for this metric, or a figure is missing)."""
    m = METRICS.get(name)
    if m is None or not m.better or a is None or b is None:
        return ""
    tolerance = max(tie_ratio * max(abs(a), abs(b)), tie_ms if m.unit == "ms" else 0.0)
    if abs(a - b) <= tolerance:
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
        trs.append(f'<tr><th title="{html.escape(hover(name))}">{html.escape(_label(name))}</th>'
                   f'{"".join(cells)}<td>{html.escape(delta)}</td><td>{ratio}</td>'
                   f'<td class="lab-winner">{win}</td></tr>')
    return ('<table class="lab-table lab-delta"><thead><tr><th>metric</th>'
            f"<th>A: {html.escape(label_a)}</th><th>B: {html.escape(label_b)}</th>"
            f'<th>B − A</th><th>B / A</th><th>winner</th></tr></thead><tbody>{"".join(trs)}</tbody></table>')


def replies_note(a: dict, b: dict) -> str:
    """One line under the A/B table: do the two replies say the same thing, and if not, where they
    part and the likely reason. Greedy text can legitimately differ between configs: quantized
    weights are other numbers, and in bf16 a speculative verify pass (several rows through one GEMM)
    rounds near-ties differently from one-row steps (README: Exactness)."""
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
               "near-ties differently from one-token steps (exact in fp32; see the README's Exactness)")
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
