"""Where a pair's TTFT change came from: B's TTFT minus A's, split into measured terms that add up.

* prefill tokens avoided: (B's prefill tokens − A's) × the measured prefill cost per token of the
  reply that prefilled more (it did the work the other avoided);
* prefill rate: the rest of the prefill change (the same tokens cost more or less per token);
* queue; setup (with its measured parts: KV copy, compile, weights variant built);
* server gaps: between stages (received → enqueued, setup done → prefill start);
* network: browser TTFT − server TTFT (transport overhead), where the browser measured both.

Each term is a difference of figures the Timeline measured, so their sum is the measured change
(browser TTFT where both replies have one, else server TTFT); the table shows both. Pure functions.
"""

from __future__ import annotations

import html

from ..shell.glossary import hover

SETUP_PARTS = (("kv_copy_ms", "KV copy"), ("compile_ms", "compile"), ("capture_ms", "graph capture"), ("variant_build_ms", "weights variant built"))


def _get(tl: dict, name: str):
    v = tl.get(name)
    if v is None:
        v = (tl.get("client") or {}).get(name)
    return v


def _delta(ta: dict, tb: dict, name: str, missing_is_zero: bool = False):
    a, b = _get(ta, name), _get(tb, name)
    if missing_is_zero:
        a, b = a or 0.0, b or 0.0
    return None if a is None or b is None else b - a


def attribution(ta: dict, tb: dict) -> dict | None:
    """`ta`, `tb`: the two replies' Timeline dicts (client joined). None without both server TTFTs."""
    if ta.get("ttft_ms") is None or tb.get("ttft_ms") is None:
        return None
    browser = _get(ta, "client_ttft_ms") is not None and _get(tb, "client_ttft_ms") is not None
    measured = _delta(ta, tb, "client_ttft_ms" if browser else "ttft_ms")
    pa, pb = ta.get("prefill_tokens"), tb.get("prefill_tokens")
    fa, fb = ta.get("prefill_ms"), tb.get("prefill_ms")
    terms = []
    if None not in (pa, pb, fa, fb):
        more_ms, more_tokens = (fa, pa) if pa >= pb else (fb, pb)
        per_token = more_ms / more_tokens if more_tokens else 0.0
        avoided = (pb - pa) * per_token
        terms.append({"name": "prefill_tokens", "label": f"prefill tokens avoided ({pa - pb:+,} tok × "
                      f"{per_token:.2f} ms/tok measured)", "ms": avoided})
        terms.append({"name": "prefill_ms", "label": "prefill rate (the rest of the prefill change)",
                      "ms": (fb - fa) - avoided})
    for name, label in (("queue_ms", "queue"), ("setup_ms", "setup")):
        terms.append({"name": name, "label": label, "ms": _delta(ta, tb, name)})
    parts = [(label, _delta(ta, tb, key, missing_is_zero=True)) for key, label in SETUP_PARTS]
    parts = [(label, v) for label, v in parts if v]
    if parts:
        terms[-1]["label"] += " (of which " + ", ".join(f"{label} {v:+,.1f} ms" for label, v in parts) + ")"

    def gaps(tl):
        stages = [tl.get(k) for k in ("queue_ms", "setup_ms", "prefill_ms")]
        return None if None in stages else tl["ttft_ms"] - sum(stages)

    ga, gb = gaps(ta), gaps(tb)
    terms.append({"name": "ttft_ms", "label": "server gaps between stages",
                  "ms": None if ga is None or gb is None else gb - ga})
    if browser:
        terms.append({"name": "transport_overhead_ms", "label": "network (browser TTFT − server TTFT)",
                      "ms": _delta(ta, tb, "transport_overhead_ms")})
    known = [t["ms"] for t in terms if t["ms"] is not None]
    return {"measured_ms": measured, "clock": "browser" if browser else "server", "terms": terms,
            "sum_ms": sum(known) if len(known) == len(terms) else None}


def attribution_html(ta: dict, tb: dict) -> str:
    rep = attribution(ta, tb)
    if rep is None or rep["measured_ms"] is None:
        return ""

    def ms(v):
        return "—" if v is None else f"{v:+,.1f} ms"

    rows = "".join(f'<tr><th title="{html.escape(hover(t["name"]))}">{html.escape(t["label"])}</th>'
                   f'<td>{ms(t["ms"])}</td></tr>' for t in rep["terms"])
    which = "TTFT (browser)" if rep["clock"] == "browser" else "TTFT (server)"
    return (f'<h4 class="lab-h">Where the TTFT change came from</h4><table class="lab-table lab-attribution">'
            f'<tbody>{rows}<tr class="lab-sum"><th title="{html.escape(hover("ttft_attribution"))}">sum of the '
            f'terms</th><td>{ms(rep["sum_ms"])}</td></tr><tr><th>measured change in {which} (B − A)</th>'
            f'<td>{ms(rep["measured_ms"])}</td></tr></tbody></table>')
