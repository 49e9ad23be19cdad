"""The overlay builders (ui/chat/overlays.js) are pure functions; these tests run them in Chromium on
synthetic replies: no engine, no server (Playwright serves the ES modules from ui/). Node runs the
layout parts too: tests/js/overlays.test.js."""

import pytest

# A reply: the server received it at server-clock 1,000,000 ms; the browser pressed send at its
# 500 ms and its clock is 999,490 ms behind, so "received" is 10 ms after send. Queue 2 ms, setup
# 3 ms, prefill to 80 ms, then tokens every 20 ms; a speculative step gives tokens 5-7 at once.
TOKENS = [80, 100, 120, 140, 160, 160, 160, 180, 200, 220]
TIMELINE = {"received_ns": 1_000_000 * 10**6, "ttft_ms": 80, "e2e_ms": 240, "finish_reason": "stop",
            "events_ms": {"enqueued": 0.1, "started": 2.1, "setup_done": 5.1, "prefill_start": 5.2},
            "token_ms": TOKENS, "prompt_tokens": 1380, "cached_tokens": 1312, "prefill_tokens": 68}
CLIENT = {"send_at_ms": 500, "clock_offset_ms": 1_000_000 - 510, "clock_bound_ms": 0.4,
          "arrival_ms": [95, 114, 133, 154, 175, 196, 215, 236, 600],
          "arrival_tokens": [1, 2, 3, 4, 7, 8, 9, 10, 10],
          "paint_ms": [101, 118, 135, 167, 184, 201, 218, 240, 610]}


@pytest.fixture(scope="module")
def js(chromium):
    from ui.shell.static import PREFIX, route_modules

    page = chromium.new_page()
    origin = route_modules(page)  # the modules served from ui/ without a server
    page.evaluate("async (url) => { window.LabOverlays = await import(url); }", origin + PREFIX + "chat/overlays.js")
    yield lambda expr, arg=None: page.evaluate(f"(arg) => {{ const O = window.LabOverlays; return {expr}; }}", arg)
    page.close()


def view(js, timeline=TIMELINE, client=CLIENT, opts=None):
    return js("O.viewOf(arg[0], arg[1], arg[2])", [timeline, client, opts or {}])


def test_view_places_server_events_on_the_browser_axis(js):
    v = view(js)
    assert v["clockKnown"] and v["received"] == pytest.approx(10)
    assert v["stages"]["network_in"] == pytest.approx([0, 10])
    assert v["stages"]["queue"] == pytest.approx([10.1, 12.1])
    assert v["stages"]["prefill"] == pytest.approx([15.2, 90])
    assert v["stages"]["network_out"] == pytest.approx([90, 101])
    assert v["stages"]["paint_lag"] == pytest.approx([230, 610])
    assert v["client_ttft_ms"] == 101 and v["client_e2e_ms"] == 610
    # the speculative step: three tokens share one instant on the server-emit line
    assert [p[0] for p in v["serverTokens"][4:7]] == pytest.approx([170, 170, 170])


def test_paint_lag_ignores_a_final_chunk_without_text(js):
    v = view(js, client={**CLIENT, "paint_ms": CLIENT["paint_ms"][:-1] + [None]})
    assert v["client_e2e_ms"] == 240  # the last painted text
    assert v["stages"]["paint_lag"] == pytest.approx([230, 240])  # token 10 (sampled at 220 + 10)


def test_without_a_clock_offset_the_server_starts_at_zero(js):
    v = view(js, client={**CLIENT, "clock_offset_ms": None})
    assert not v["clockKnown"] and v["received"] == 0 and v["stages"]["network_in"] is None
    assert "no clock offset yet" in js("O.waterfall(arg, {})", v)


def test_live_view_has_no_totals_yet(js):
    live = {"received_ns": TIMELINE["received_ns"], "events_ms": {"enqueued": 0.1, "started": 2.1},
            "token_ms": []}
    v = view(js, timeline=live, client={**CLIENT, "arrival_ms": [], "arrival_tokens": [], "paint_ms": []},
             opts={"now": 50})
    assert v["ttft_ms"] is None and v["client_ttft_ms"] is None and not v["finished"]
    svg = js("O.ttftVsTotal(arg, {})", v)
    assert "waiting" in svg  # a growing wait bar until the first token
    assert js("O.extent([arg])", v) >= 50


def test_ttft_vs_total_labels_both_clocks(js):
    svg = js("O.ttftVsTotal(arg, {})", view(js))
    assert "TTFT 80 ms · total 240 ms" in svg and "TTFT 101 ms · total 610 ms" in svg


def test_waterfall_labels_each_stage_in_ms_with_the_cross_clock_bound(js):
    svg = js("O.waterfall(arg, {})", view(js))
    for label in ("network in", "queue", "setup", "prefill", "decode", "network out + paint", "last paint lag"):
        assert f"{label}</text>" in svg
    assert "75 ms" in svg  # prefill 15.2 → 90
    assert "11 ms ±0.4 ms" in svg  # network out + paint, across clocks


def test_token_timeline_draws_three_series_pace_and_stalls(js):
    svg = js("O.tokenTimeline(arg, {})", view(js, opts={"readingPace": 5.3}))
    assert svg.count("<path") == 3
    assert "reading pace: 5.3 tok/s" in svg
    assert "stall: 370 ms" in svg  # the last paint came 370 ms after the one before
    stalls = js("O.stalls(arg, 50, 4)", [[0, 1], [10, 2], [20, 3], [30, 4], [200, 5]])
    assert stalls == [[30, 200]]


def test_effects_show_only_what_the_engine_reported(js):
    plain = js("O.effects(arg, {})", view(js))
    assert "1,312 cached · 68 prefilled" in plain and "speculation" not in plain
    spec = {**TIMELINE, "drafted": 40, "accepted": 30, "tokens_per_step": 2.5, "accepted_hist": [3, 1, 4, 6],
            "backoffs": 1, "k_changes": [{"token": 0, "k": 4}, {"token": 9, "k": 0}, {"token": 20, "k": 2}]}
    html = js("O.effects(arg, {})", view(js, timeline=spec))
    assert "30 of 40 drafts accepted (75%)" in html and "2.50 tok/step" in html
    assert html.count("steps accepted") == 4
    assert "k changed 3× (backed off to none 1×), last k=2 at token 20" in html
    assert "no optimization figures" in js("O.effects(arg, {})", view(js, timeline={"token_ms": []}))


def test_one_time_scale_and_round_ticks(js):
    assert js("[O.niceMax(0), O.niceMax(7), O.niceMax(130), O.niceMax(2400)]") == [1, 10, 200, 2500]
    assert js("O.ticks(1000, 4)") == [0, 250, 500, 750, 1000]
    short = view(js)
    longer = view(js, timeline={**TIMELINE, "e2e_ms": 3000})
    assert js("O.extent(arg)", [short, longer]) == 5000
    assert js("O.all(arg, {xMax: 5000})", short).count(">5,000 ms<") == 3  # all three charts share the axis


def test_long_replies_are_decimated_to_the_pixels_without_losing_the_ends(js):
    points = [[i * 0.5, i + 1] for i in range(10_000)]
    kept = js("O.decimate(arg, 5000)", points)
    assert len(kept) <= 2 * (600 - 132) + 1
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert all(a[1] < b[1] for a, b in zip(kept, kept[1:]))  # still in order, still cumulative
    assert js("O.decimate(arg, 5000)", points[:50]) == points[:50]  # short series are untouched
