"""Per-reply records and the rows derived from them. Pure functions: no engine, no Gradio.

A *record* is one reply: `{request_id, session, pane, turn, settings, prompt, timeline}` where
`timeline` is `Timeline.to_dict()` and `timeline["client"]` holds the browser's timestamps and
the metrics joined from them (`join_client`). A *row* is the flat dict of numbers the tables,
stats lines, A/B deltas and sweeps use (`row`); rows and records export as CSV/JSON here. How a
row is shown: ui/chat/record_view.py; two configs compared: ui/compare/delta.py.
"""

from __future__ import annotations

import csv
import io
import json
import math

from engine.core.config import TOGGLES
from engine.core.errors import InvalidRequest
from engine.core.thinking import perceived_thinking

from . import perceived
from .settings import PAGE_SETTINGS

READING_PACE_TPS = 5.3  # silent reading ~238 words/min at ~0.75 words/token (Brysbaert 2019, 'How many words do we read per minute?')
MAX_CLIENT_CHUNKS = 100_000

# A reply that opens with a thought (engine/core/thinking.py): the server's figures and the browser's.
THOUGHT = ("ttft_thought_ms", "thinking_ms", "ttfa_ms", "thought_tokens")
CLIENT_THOUGHT = ("client_ttft_thought_ms", "client_thinking_ms", "client_ttfa_ms")
THOUGHT_COLUMNS = [*THOUGHT, *CLIENT_THOUGHT]

# The columns of the per-conversation table and its CSV export, in order.
ROW_COLUMNS = [
    "turn", "pane", "request_id", "config", "finish_reason",
    "ttft_ms", "client_ttft_ms", "transport_overhead_ms", "tpot_ms", "decode_tps", "e2e_ms", "client_e2e_ms",
    "queue_ms", "setup_ms", "prefill_ms", "network_in_ms", "network_out_ms", "clock_bound_ms",
    "prompt_tokens", "cached_tokens", "prefill_tokens", "output_tokens",
    *THOUGHT_COLUMNS,
    "drafted", "accepted", "acceptance_rate", "tokens_per_step", "quantization", "weight_mb",
    "prefill_tps", "context_tokens", "context_max", "prefill_tflops", "prefill_compute_fraction",
    "decode_gbps", "decode_bandwidth_fraction", "decode_mb_per_token", "peak_tflops", "read_gbps",
    "copy_gbps",
    *perceived.METRICS, "smoothing",
]


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
    perceived metrics (ui/chat/perceived.py) need the reply's `text` and the page's `shown_*` lists.
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
    out.update(dict.fromkeys(CLIENT_THOUGHT))
    if shown and text is not None:
        out.update(perceived.perceived(checked, text, int(timeline.get("output_tokens") or 0), pace))
        out.update(perceived_thinking(text, chars, painted))  # when the thought and the answer were painted
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
                "decode_bandwidth_fraction", *THOUGHT):
        r[key] = tl.get(key)
    roof = tl.get("roofline") or {}
    r["peak_tflops"], r["read_gbps"], r["copy_gbps"] = (roof.get("peak_tflops"), roof.get("read_gbps"),
                                                         roof.get("copy_gbps"))
    r["compute_dtype"], r["peak_unit"], r["limits_date"] = (roof.get("compute_dtype"), roof.get("peak_unit"),
                                                            roof.get("limits_date"))
    r["limits_note"] = roof.get("limits_note")  # a fraction above 100%: why (engine/measure/roofline.py)
    per_token = tl.get("decode_bytes_per_token")
    r["decode_mb_per_token"] = per_token / 1e6 if per_token else None
    r["measured_at"] = tl.get("measured_at")  # "client": a remote engine, measured from here
    for key in ("client_ttft_ms", "client_e2e_ms", "transport_overhead_ms", "network_in_ms", "network_out_ms",
                "paint_lag_ms", "clock_bound_ms", *perceived.METRICS, *CLIENT_THOUGHT, "smoothing"):
        r[key] = client.get(key)
    # Feature counters arrive as timeline fields when those features are merged; absent → None.
    for key in ("drafted", "accepted", "acceptance_rate", "tokens_per_step"):
        r[key] = tl.get(key)
    if r["acceptance_rate"] is None and r["drafted"]:
        r["acceptance_rate"] = (r["accepted"] or 0) / r["drafted"]
    weight = tl.get("weight_bytes")  # the variant that served it, as the engine stamped it (None: unknown)
    r["weight_mb"] = weight / 1e6 if weight else None
    return r


# --- exports --------------------------------------------------------------------------------------
def rows_to_csv(rows: list[dict], columns: list[str] = ROW_COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})
    return buf.getvalue()


def records_to_json(records: list[dict]) -> str:
    return json.dumps({"records": records, "rows": [row(r) for r in records]}, indent=1)
