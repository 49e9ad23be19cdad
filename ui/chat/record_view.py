"""How one reply's figures are shown: numbers with their units, the stats lines under a message,
the what-happened sentence, and the per-turn table. Pure functions: no engine, no Gradio.
"""

from __future__ import annotations

import html
import math

from ..shell.glossary import METRICS, hover
from .records import READING_PACE_TPS


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
            return "the machine's read bandwidth is not measured (re-measure the limits)"
        if name.startswith("decode") and (r.get("output_tokens") or 0) < 2:
            return "fewer than two output tokens: no decode step"
        return "the engine reported no model shape or weight bytes for this reply"
    return "the backend did not report it"


def _known(name: str, r: dict, text: str) -> str:
    """A stats-line figure; '—' with the reason on hover when it is None."""
    if r.get(name) is not None:
        if name.endswith("_fraction") and r[name] > 1:  # a stale roof (probed while busy) or bytes from the cache:
            note = r.get("limits_note") or "above the measured limit: limit stale"  # never printed as a share
            stage = "prefill" if name.startswith("prefill") else "decode"
            return (f'<span class="lab-over" title="{html.escape(hover(name))} — {html.escape(note)}">'
                    f'{stage} {html.escape(note)}</span>')
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
    if r.get("ttft_thought_ms") is not None:  # a reply that opened with a thought: its answer's own TTFT
        parts.append(_thought_html(r))
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


def _thought_html(r: dict) -> str:
    """Thought for how long, and when the answer began: as the server measured it and as the browser showed it."""
    out = _span("thinking_ms", f"thought {fmt('thinking_ms', r.get('thinking_ms'))}")
    if r.get("client_thinking_ms") is not None:
        out += " " + _span("client_thinking_ms", f"(seen {fmt('client_thinking_ms', r['client_thinking_ms'])})")
    out += " · " + _span("ttfa_ms", f"answer TTFT {fmt('ttfa_ms', r.get('ttfa_ms'))}")
    if r.get("client_ttfa_ms") is not None:
        out += " " + _span("client_ttfa_ms", f"(seen {fmt('client_ttfa_ms', r['client_ttfa_ms'])})")
    return f'<span class="lab-thought-stats">{out}</span>'


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
    head = "".join(f'<th title="{html.escape(hover(c))}">{html.escape(headers.get(c) or metric_label(c))}</th>'
                   for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c, r.get(c)))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f'<table class="lab-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def metric_label(name: str) -> str:
    m = METRICS.get(name)
    return m.label if m else name.replace("_", " ")
