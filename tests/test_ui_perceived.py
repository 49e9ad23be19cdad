"""Engine-free tests of the perceived-latency metrics (ui/chat/perceived.py), their join to a reply's
timeline, how the page shows them, and the smoothing / chunked-prefill settings and presets."""

import pytest

from engine.core.errors import InvalidRequest
from ui.chat import perceived, record_view, records, settings
from ui.shell import presets
from ui.shell.glossary import METRICS

TEXT = "The cat sat. On the mat"  # five words; word ends at 3, 7, 12, 15, 19, 23


def test_word_ends_and_when_each_word_became_visible():
    assert perceived.word_ends(TEXT) == [3, 7, 12, 15, 19, 23]
    # shown in three updates: "The ca" (no whole second word yet), "The cat sat. On", the rest
    times = perceived.word_paint_times(TEXT, [6, 15, 23], [100.0, 150.0, 400.0])
    assert times == [100.0, 150.0, 150.0, 150.0, 400.0, 400.0]
    # a stopped reply: words never shown are not counted; an update not yet painted stops the count
    assert perceived.word_paint_times(TEXT, [7], [90.0]) == [90.0, 90.0]
    assert perceived.word_paint_times(TEXT, [7, 23], [90.0, None]) == [90.0, 90.0]


def test_gap_stats_are_the_cv_and_the_longest_gap():
    cv, longest = perceived.gap_stats([0.0, 10.0, 20.0, 30.0])
    assert cv == 0.0 and longest == 10.0
    cv, longest = perceived.gap_stats([0.0, 0.0, 0.0, 90.0])  # a burst of three, then a 90 ms stall
    assert cv == pytest.approx(2 ** 0.5) and longest == 90.0
    assert perceived.gap_stats([5.0]) == (None, None)


def test_the_reader_waits_only_when_the_painted_text_runs_out():
    # 0.1 chars/ms reader; 10 chars at t=0 (read by 100), 10 more at 300 (waited 200), 10 more at 350
    # (not caught up yet: 5 of the second batch read)
    paints = [(0.0, 10.0), (300.0, 20.0), (350.0, 30.0)]
    assert perceived.reader_wait_ms(paints, 0.1) == pytest.approx(200.0)
    # a stream far ahead of the reader: no wait
    assert perceived.reader_wait_ms([(0.0, 100.0), (50.0, 200.0), (100.0, 300.0)], 0.1) == 0.0
    assert perceived.reader_wait_ms([], 0.1) is None


def test_smoothing_hold_runs_from_the_last_text_arrival_to_the_last_text_shown():
    # the last chunk (an end-of-sequence token) carries no text: it does not count as the last text
    assert perceived.smoothing_hold_ms([10.0, 50.0, 60.0], [5.0, 12.0, 12.0], [10.0, 80.0, 130.0]) == 80.0
    assert perceived.smoothing_hold_ms([10.0, 50.0], [5.0, 12.0], [10.0, 50.0]) == 0.0  # smoothing off
    assert perceived.smoothing_hold_ms([10.0], [0.0], []) is None


def timeline():
    return {"request_id": "r", "received_ns": 10**15, "ttft_ms": 80.0, "token_ms": [80.0, 100.0, 120.0, 140.0],
            "output_tokens": 4, "finish_reason": "stop"}


RAW = {"send_at_ms": 500.0, "arrival_ms": [95.0, 115.0, 135.0, 155.0], "arrival_tokens": [1, 2, 3, 4],
       "arrival_chars": [3.0, 12.0, 19.0, 23.0], "paint_ms": [101.0, 130.0, 180.0, 220.0],
       "shown_ms": [95.0, 125.0, 170.0, 210.0], "shown_chars": [3.0, 12.0, 19.0, 23.0],
       "shown_paint_ms": [101.0, 130.0, 180.0, 220.0], "feedback_ms": 12.0, "status_ms": 30.0,
       "smoothing": {"mode": "adaptive", "unit": "word", "max_hold_ms": 150}, "reading_pace_tps": 5.3}


def test_join_client_adds_the_perceived_metrics():
    c = records.join_client(timeline(), RAW, TEXT)
    assert c["client_feedback_ms"] == 12.0 and c["client_status_ms"] == 30.0
    assert c["client_first_word_ms"] == 101.0 and c["client_ttft_ms"] == 101.0
    words = [101.0, 130.0, 130.0, 180.0, 180.0, 220.0]
    cv, longest = perceived.gap_stats(words)
    assert c["paint_gap_cv"] == pytest.approx(cv) and c["paint_gap_max_ms"] == 50.0
    assert c["smoothing_hold_ms"] == 55.0 and c["smoothing"] == "adaptive/word"
    assert c["reader_wait_ms"] == 0.0  # 5.3 tok/s is far slower than this stream
    row = records.row({"settings": {"smoothing": "adaptive", "smooth_unit": "word", "chunked_prefill": True},
                       "timeline": {**timeline(), "client": c}})
    assert row["paint_gap_max_ms"] == 50.0 and "smooth adaptive · by word" in row["config"]
    assert "chunked prefill" in row["config"]
    line = record_view.perceived_line_html(row)
    for name in ("client_feedback_ms", "client_first_word_ms", "paint_gap_cv", "paint_gap_max_ms", "reader_wait_ms",
                 "smoothing_hold_ms"):
        assert METRICS[name].start and f'title="{METRICS[name].hover}"'.replace("'", "&#x27;") in line


def test_join_client_without_the_pages_shown_lists_leaves_perceived_metrics_empty():
    old = {k: v for k, v in RAW.items() if not k.startswith("shown") and k != "arrival_chars"}
    c = records.join_client(timeline(), old, TEXT)
    assert c["client_feedback_ms"] == 12.0 and c["paint_gap_cv"] is None and c["smoothing_hold_ms"] is None
    assert records.join_client(timeline(), RAW)["paint_gap_cv"] is None  # no reply text to find words in


@pytest.mark.parametrize("bad", [{"shown_chars": [3.0]}, {"shown_paint_ms": [1.0, 2.0]}, {"arrival_chars": [1.0]},
                                 {"feedback_ms": "soon"}, {"shown_ms": [1.0, float("inf"), 2.0, 3.0]}])
def test_join_client_refuses_malformed_perceived_timings(bad):
    with pytest.raises(InvalidRequest):
        records.join_client(timeline(), {**RAW, **bad}, TEXT)


def test_smoothing_and_chunked_prefill_settings():
    read = settings.PaneSettings.read({"chunked_prefill": True, "smoothing": "pace", "smooth_unit": "char"})
    assert read.config.chunked_prefill is True and read.page["smoothing"] == "pace"
    applied = settings.PaneSettings.read({"chunked_prefill": False, "smoothing": "adaptive"}).applied()
    assert applied["chunked_prefill"] is False and applied["smoothing"] == "adaptive" and applied["smooth_unit"] == "word"
    for bad, param in (({"smoothing": "fast"}, "smoothing"), ({"smooth_unit": "line"}, "smooth_unit"),
                       ({"chunked_prefill": "yes"}, "chunked_prefill")):
        with pytest.raises(InvalidRequest) as err:
            settings.PaneSettings.read(bad)
        assert err.value.param == param


def test_the_smoothing_and_chunked_prefill_presets_change_one_thing():
    for name, toggle in (("smoothing", "smoothing"), ("chunked_prefill", "chunked_prefill")):
        p = presets.TEACHING[name]
        differ = {k for k in set(p["a"]) | set(p["b"]) if p["a"].get(k) != p["b"].get(k)}
        assert toggle in differ and differ <= {toggle, "smooth_unit"}
        for side in ("a", "b"):
            settings.PaneSettings.read(p[side])  # valid settings
    assert presets.TEACHING["smoothing"]["a"]["speculative"] == "prompt_lookup"  # a bursty reply on both sides
