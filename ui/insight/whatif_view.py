"""The what-if line under a reply (engine/measure/whatif.py): a prediction for another prompt
length, weights variant or batch size, and once the user ran it, the measured value and the error.
"""

from __future__ import annotations

import html

from engine.measure import whatif

from ..shell.glossary import hover


def _ms(v) -> str:
    return "—" if v is None else f"{v:,.0f} ms" if v >= 10 else f"{v:,.1f} ms"


def prediction_html(p: whatif.Prediction | None, what: str) -> str:
    if p is None:
        return ('<span class="lab-muted">no prediction: this reply measured too little (no prefill time, or no '
                'decode step and no machine limits)</span>')
    return (f'<span class="lab-whatif-pred" title="{html.escape(hover("whatif_ttft_ms"))}">{html.escape(what)}: '
            f'predicted TTFT <b class="lab-whatif-ttft">{_ms(p.ttft_ms)}</b>, TPOT {_ms(p.tpot_ms)} '
            f'({p.prefill_tokens:,} prefill tokens)</span> <span class="lab-muted">{html.escape(p.how)}</span>')


def check(base_tl: dict, measured_tl: dict, shape, weight_bytes=None, batch: int = 1) -> dict | None:
    """The prediction from the base reply at the prompt that really ran, against its measured TTFT/TPOT."""
    p = whatif.predict(base_tl, shape, prefill_tokens=measured_tl.get("prefill_tokens"),
                       cached_tokens=measured_tl.get("cached_tokens") or 0, weight_bytes=weight_bytes, batch=batch)
    if p is None or measured_tl.get("ttft_ms") is None:
        return None

    def err(pred, meas):
        return None if pred is None or not meas else pred / meas - 1

    return {"prediction": p.to_dict(), "measured_ttft_ms": measured_tl["ttft_ms"],
            "measured_tpot_ms": measured_tl.get("tpot_ms"), "ttft_error": err(p.ttft_ms, measured_tl["ttft_ms"]),
            "tpot_error": err(p.tpot_ms, measured_tl.get("tpot_ms"))}


def check_html(c: dict | None) -> str:
    if c is None:
        return '<span class="lab-muted">no check: one of the replies measured too little</span>'
    p = c["prediction"]

    def pct(v):
        return "—" if v is None else f"{100 * v:+.0f}%"

    return (f'<span class="lab-whatif-check" title="{html.escape(hover("whatif_error"))}">at the '
            f'{p["prefill_tokens"]:,} prefill tokens that ran: TTFT predicted <b>{_ms(p["ttft_ms"])}</b>, measured '
            f'<b>{_ms(c["measured_ttft_ms"])}</b>, error <b class="lab-whatif-err">{pct(c["ttft_error"])}</b>; '
            f'TPOT predicted {_ms(p["tpot_ms"])}, measured {_ms(c["measured_tpot_ms"])} '
            f'({pct(c["tpot_error"])})</span>')
