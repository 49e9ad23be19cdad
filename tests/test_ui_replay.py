"""The speculation replay's block (ui/insight/replay.py) from a made-up Timeline: every token in its
step, accepted and rejected drafts told apart, the figures and the warning."""

from __future__ import annotations

import re

import pytest

from ui.insight import replay


def decode(ids):
    return "".join(f"<{i}>" for i in ids)


TIMELINE = {
    # output: 10 | verify: drafts 11 12 13, 2 accepted, own 20 | plain 21 | verify: draft 22 accepted, own 23
    "draft_steps": [[1, 2, [11, 12, 13]], [5, 1, [22]]], "draft_step_count": 2, "predicted_speedup": 1.4,
    "cost_model": {"step_ms": 50.0, "measured": True}, "tpot_ms": 40.0, "acceptance_rate": 0.75,
}
TOKENS = [10, 11, 12, 20, 21, 22, 23]


def test_every_token_sits_in_its_step_and_rejected_drafts_are_struck():
    body, last = replay.tokens_html(TOKENS, [replay.DraftStep.from_list(s) for s in TIMELINE["draft_steps"]], decode)
    found = re.findall(r'<(span|s) class="([\w-]+)" data-step="(\d+)"[^>]*>([^<]*)<', body.replace("&lt;", "[")
                       .replace("&gt;", "]"))
    assert [(c, int(st), t) for _, c, st, t in found] == [
        ("lab-tok", 0, "[10]"), ("lab-tok-acc", 1, "[11]"), ("lab-tok-acc", 1, "[12]"), ("lab-tok-rej", 1, "[13]"),
        ("lab-tok-own", 1, "[20]"), ("lab-tok", 2, "[21]"), ("lab-tok-acc", 3, "[22]"), ("lab-tok-own", 3, "[23]")]
    assert last == 3 and "<s " in body


def test_figures_and_no_warning_when_speculation_pays():
    f = replay.figures(TIMELINE)
    assert f["acceptance_by_position"] == [1.0, 1.0, 0.0] and f["measured_speedup"] == 50.0 / 40.0
    assert replay.warning(f) == ""
    html = replay.replay_html(TIMELINE, TOKENS, decode)
    assert "predicted speedup 1.40x" in html and "measured 1.25x" in html and "rejected drafts: 1" in html


def test_a_plain_warning_when_speculation_costs_time():
    slow = {**TIMELINE, "tpot_ms": 62.5, "acceptance_rate": 0.1}
    text = replay.warning(replay.figures(slow))
    assert text.startswith("Speculation is costing time in this reply: its TPOT (62.5 ms) is above a plain decode "
                           "step (50.0 ms")
    assert "0.80x" in text and "10%" in text
    assert 'class="lab-spec-warning"' in replay.replay_html(slow, TOKENS, decode)
    assert replay.replay_html({"tpot_ms": 3.0}, TOKENS, decode) == ""  # no speculation: no block


def test_the_ttft_change_splits_into_measured_terms_that_add_up():
    from ui.compare import attribution

    a = {"ttft_ms": 900.0, "queue_ms": 5.0, "setup_ms": 10.0, "prefill_ms": 880.0, "prefill_tokens": 400,
         "client": {"client_ttft_ms": 960.0, "transport_overhead_ms": 60.0}}
    b = {"ttft_ms": 130.0, "queue_ms": 7.0, "setup_ms": 14.0, "prefill_ms": 105.0, "prefill_tokens": 40,
         "kv_copy_ms": 3.5, "client": {"client_ttft_ms": 200.0, "transport_overhead_ms": 70.0}}
    rep = attribution.attribution(a, b)
    terms = {t["name"]: t["ms"] for t in rep["terms"]}
    assert terms["prefill_tokens"] == -360 * 2.2  # 360 tokens avoided at A's 2.2 ms per token
    assert terms["prefill_ms"] == (105.0 - 880.0) + 360 * 2.2
    assert terms["queue_ms"] == 2.0 and terms["setup_ms"] == 4.0 and terms["transport_overhead_ms"] == 10.0
    assert rep["clock"] == "browser" and rep["measured_ms"] == -760.0 and rep["sum_ms"] == pytest.approx(-760.0)
    html = attribution.attribution_html(a, b)
    assert "KV copy +3.5 ms" in html and "-760.0 ms" in html
    no_browser = attribution.attribution({**a, "client": {}}, {**b, "client": {}})
    assert no_browser["clock"] == "server" and no_browser["sum_ms"] == pytest.approx(-770.0)


def test_the_measured_speedup_prefers_this_replys_own_plain_steps():
    # tokens 0..9: verify at 1 (2 accepted: tokens 1-3), plain steps give tokens 4..9 at 30 ms each
    tl = {"draft_steps": [[1, 2, [5, 6, 7]]], "draft_step_count": 1, "tpot_ms": 20.0, "plain_step_ms": 50.0,
          "token_ms": [100.0, 140.0, 140.0, 140.0, 170.0, 200.0, 230.0, 260.0, 290.0, 320.0]}
    assert replay.plain_steps_ms(tl) == [30.0] * 6
    f = replay.figures(tl)
    assert f["plain_step_ms"] == 30.0 and f["measured_speedup"] == 1.5 and "6 plain steps" in f["plain_step_from"]
    few = {**tl, "token_ms": tl["token_ms"][:6]}  # 2 plain steps: the calibrated step serves
    assert replay.figures(few)["plain_step_ms"] == 50.0
