"""Engine-free tests of what the page derives from a reply: browser timings joined to a Timeline,
rows, stats lines, "what happened", A/B winners, sweep percentiles, exports, settings, presets."""

import csv
import io
import json

import pytest

from engine.core.errors import InvalidRequest
from ui.compare import delta as compare
from ui.shell import presets
from ui.chat import record_view, records, settings
from ui.shell.glossary import METRICS, as_json, hover


def timeline(**over):
    """A Timeline.to_dict()-shaped record: received at server 1,000,000 ms, first token at +80 ms."""
    tl = {"request_id": "req-1", "received_ns": 1_000_000 * 10**6, "ttft_ms": 80.0, "e2e_ms": 400.0,
          "queue_ms": 2.0, "setup_ms": 3.0, "prefill_ms": 70.0, "tpot_ms": 20.0, "decode_tps": 50.0,
          "prompt_tokens": 1380, "cached_tokens": 1312, "prefill_tokens": 68, "output_tokens": 16,
          "finish_reason": "stop", "queue_position": 0, "token_ms": [80.0 + 20 * i for i in range(16)],
          "events_ms": {"received": 0.0, "enqueued": 0.1, "started": 2.1, "setup_done": 5.1}}
    tl.update(over)
    return tl


# The browser pressed send at its 500 ms; its clock reads 999,490 ms less than the server's, so the
# server received the request 10 ms after send (network in).
CLIENT = {"send_at_ms": 500.0, "clock_offset_ms": 1_000_000.0 - 510.0, "clock_rtt_ms": 1.0,
          "arrival_ms": [92.0, 95.0, 200.0], "arrival_tokens": [1, 2, 16], "paint_ms": [None, 101.0, 210.0]}


def test_join_client_derives_the_glossary_metrics():
    c = records.join_client(timeline(), CLIENT)
    assert c["client_ttft_ms"] == 101.0  # the first chunk had no text: the first *text* painted counts
    assert c["client_e2e_ms"] == 210.0
    assert c["transport_overhead_ms"] == pytest.approx(101.0 - 80.0)
    assert c["network_in_ms"] == pytest.approx(10.0)
    assert c["network_out_ms"] == pytest.approx(101.0 - (10.0 + 80.0))
    assert c["paint_lag_ms"] == pytest.approx(210.0 - (10.0 + 380.0))
    assert c["clock_bound_ms"] == 0.5
    # the three cross-clock pieces add up to the browser's TTFT, by construction
    assert c["network_in_ms"] + 80.0 + c["network_out_ms"] == pytest.approx(c["client_ttft_ms"])


def test_paint_lag_refers_to_the_token_behind_the_last_painted_text():
    # the last chunk is an end-of-sequence token with no text: it paints nothing
    c = records.join_client(timeline(), {**CLIENT, "paint_ms": [None, 125.0, None]})
    assert c["client_e2e_ms"] == 125.0
    assert c["paint_lag_ms"] == pytest.approx(125.0 - (10.0 + 100.0))  # token 2 was sampled at +100 ms


def test_join_client_without_a_clock_keeps_the_clock_free_metrics():
    c = records.join_client(timeline(), {**CLIENT, "clock_offset_ms": None, "clock_rtt_ms": None})
    assert c["transport_overhead_ms"] == pytest.approx(21.0)  # needs no clock sync
    assert c["network_in_ms"] is None and c["network_out_ms"] is None and c["clock_bound_ms"] is None


@pytest.mark.parametrize("bad", [
    {"arrival_ms": "soon"},
    {"arrival_ms": [1.0, float("nan")]},
    {"arrival_ms": [1.0, 2.0], "paint_ms": [1.0]},
    {"arrival_ms": [1.0], "arrival_tokens": [1, 2]},
    {"send_at_ms": "now"},
    {"arrival_ms": [True]},
])
def test_join_client_refuses_malformed_timings(bad):
    with pytest.raises(InvalidRequest):
        records.join_client(timeline(), {**CLIENT, **bad})


def test_row_reads_feature_counters_only_when_present():
    plain = records.row({"turn": 1, "pane": "chat", "settings": {"temperature": 0}, "timeline": timeline()})
    assert plain["drafted"] is None and plain["acceptance_rate"] is None and plain["weight_mb"] is None
    spec = records.row({"settings": {"speculative": "prompt_lookup", "num_speculative_tokens": 8},
                        "timeline": timeline(drafted=40, accepted=30, tokens_per_step=2.5, weight_bytes=269_000_000)})
    assert spec["acceptance_rate"] == pytest.approx(0.75)
    assert spec["weight_mb"] == pytest.approx(269.0)
    assert "prompt lookup · k=8" in spec["config"]


def test_stats_line_has_hover_definitions_and_the_key_numbers():
    r = records.row({"timeline": {**timeline(), "client": records.join_client(timeline(), CLIENT)}})
    line = record_view.stats_line_html(r)
    assert "TTFT 80 ms" in line and "seen 101 ms" in line and "50.0 tok/s" in line and "1,312 cached" in line
    assert f'title="{hover("client_ttft_ms")}"' in line.replace("&#x27;", "'")


def test_what_happened_names_the_dominant_stage_from_the_numbers():
    r = records.row({"timeline": {**timeline(), "client": records.join_client(timeline(), CLIENT)}})
    text = record_view.what_happened(r)
    assert "mostly prefill (70 ms for 68 uncached tokens; 1,312 were cached)" in text
    assert "15 more tokens at 50.0 tok/s" in text and "Network and paint added 21 ms" in text
    queued = records.row({"timeline": timeline(queue_ms=900.0, prefill_ms=50.0, queue_position=2)})
    assert "mostly the queue (900 ms behind 2 requests)" in record_view.what_happened(queued)
    stopped = records.row({"timeline": timeline(finish_reason="cancelled")})
    assert "Stopped after 16 tokens" in record_view.what_happened(stopped)


@pytest.mark.parametrize("name, a, b, expected", [
    ("ttft_ms", 100.0, 50.0, "B"),
    ("ttft_ms", 50.0, 100.0, "A"),
    ("decode_tps", 50.0, 100.0, "B"),  # higher is better
    ("ttft_ms", 100.0, 101.0, "tie"),
    ("queue_ms", 0.2, 0.9, "tie"),  # under a millisecond apart: noise
    ("cached_tokens", 0, 1, "B"),
    ("ttft_ms", None, 50.0, ""),
    ("output_tokens", 10, 20, ""),  # no direction
])
def test_winner(name, a, b, expected):
    assert compare.winner(name, a, b) == expected


def test_delta_table_marks_the_winner_and_skips_missing_pairs():
    a = {"ttft_ms": 400.0, "decode_tps": 20.0, "cached_tokens": 0}
    b = {"ttft_ms": 100.0, "decode_tps": 40.0, "cached_tokens": 1000}
    deltas = compare.delta_rows(a, b)
    assert {d["metric"] for d in deltas} == {"ttft_ms", "decode_tps", "cached_tokens"}
    by = {d["metric"]: d for d in deltas}
    assert by["ttft_ms"]["delta"] == -300.0 and by["ttft_ms"]["ratio"] == 0.25 and by["ttft_ms"]["winner"] == "B"
    html = compare.delta_html(deltas, "no reuse", "reuse")
    assert html.count('class="lab-win"') == 3 and "B: reuse" in html


def test_percentiles_and_summary_rows():
    assert compare.percentile([], 50) is None
    assert compare.percentile([5.0], 90) == 5.0
    assert compare.percentile([1, 2, 3, 4, None], 50) == pytest.approx(2.5)
    assert compare.percentile(list(range(1, 101)), 90) == pytest.approx(90.1)
    rows = {"A": [{"ttft_ms": v} for v in (100, 110, 120)], "B": [{"ttft_ms": v} for v in (50, 60, 400)]}
    s = compare.summary_rows(rows, ["ttft_ms"])[0]
    assert s["A p50"] == 110 and s["B p50"] == 60 and s["winner"] == "B" and s["A n"] == 3


def test_csv_and_json_exports_round_trip():
    recs = [{"turn": 1, "pane": "chat", "settings": {"temperature": 0}, "timeline": timeline()}]
    rows = [records.row(r) for r in recs]
    parsed = list(csv.DictReader(io.StringIO(records.rows_to_csv(rows))))
    assert parsed[0]["ttft_ms"] == "80.0" and parsed[0]["drafted"] == "" and list(parsed[0]) == records.ROW_COLUMNS
    data = json.loads(records.records_to_json(recs))
    assert data["records"][0]["timeline"]["token_ms"][0] == 80.0 and data["rows"][0]["cached_tokens"] == 1312


def test_fmt_units():
    assert record_view.fmt("ttft_ms", 1234.4) == "1,234 ms"
    assert record_view.fmt("ttft_ms", 4.56) == "4.6 ms"
    assert record_view.fmt("decode_tps", 27.46) == "27.5 tok/s"
    assert record_view.fmt("acceptance_rate", 0.734) == "73%"
    assert record_view.fmt("cached_tokens", 1312) == "1,312 tok"
    assert record_view.fmt("ttft_ms", None) == "—"


def test_glossary_gives_every_metric_its_events():
    g = as_json()
    for name in ("ttft_ms", "client_ttft_ms", "transport_overhead_ms", "e2e_ms", "queue_ms"):
        assert g[name]["hover"] and g[name]["end"]
    assert "user pressed send" in METRICS["client_ttft_ms"].hover
    assert "each on its own clock" in METRICS["transport_overhead_ms"].hover


def test_settings_parse_and_errors():
    read = settings.PaneSettings.read({"system": "  Be brief. ", "max_new_tokens": 64.0, "temperature": 0, "seed": -1,
                                       "quantization": "", "speculative": "prompt_lookup",
                                       "num_speculative_tokens": 6.0, "backend": "local"}, ["local", "remote"])
    system, cfg = read.system, read.config
    assert system == "Be brief." and cfg.max_new_tokens == 64 and cfg.greedy and cfg.seed is None
    assert read.backend == "local" and settings.PaneSettings.read({}, ["local", "remote"]).backend == "local"
    assert cfg.quantization is None and cfg.num_speculative_tokens == 6
    for bad, field in [({"max_new_tokens": 1.5}, "max_new_tokens"), ({"temperature": -1}, "temperature"),
                       ({"speculative": "magic"}, "speculative"), ({"nonsense": 1}, "nonsense"),
                       ({"system": 5}, "system"), ({"backend": "gpu"}, "backend"), ([1], "settings")]:
        with pytest.raises(InvalidRequest) as err:
            settings.PaneSettings.read(bad, ["local"])
        assert err.value.param == field


def test_prompt_sets_and_presets_load():
    sets = presets.load_prompt_sets()
    assert {"long_history", "copy_edits", "open_questions"} <= set(sets)
    assert all(item["turns"] for s in sets.values() for item in s["items"])
    teaching = presets.teaching_presets(sets)
    assert teaching["kv_reuse"]["history"] and teaching["kv_reuse"]["a"] == {"kv_reuse": False}
    assert presets.custom_prompt_set("a\n\n b \n")["items"] == [{"turns": ["a"]}, {"turns": ["b"]}]
    with pytest.raises(InvalidRequest):
        presets.custom_prompt_set("   \n")


def test_the_ab_note_says_whether_the_replies_match_and_why_not():
    greedy = {"temperature": 0.0, "speculative": "off", "quantization": None}
    a = {"reply": "The capital is Paris.", "settings": greedy}
    assert compare.replies_note(a, dict(a)) == "The two replies are identical."
    spec = {"reply": "The capital is Lyon.", "settings": {**greedy, "speculative": "prompt_lookup"}}
    note = compare.replies_note(a, spec)
    assert note.startswith("The replies part after 15 characters") and "multi-row matmul" in note
    quant = {"reply": "The capital", "settings": {**greedy, "quantization": "nf4"}}
    assert "after 11 characters" in compare.replies_note(a, quant) and "weights" in compare.replies_note(a, quant)
    hot = {"reply": "Paris!", "settings": {**greedy, "temperature": 0.7}}
    assert "sampling" in compare.replies_note(a, hot)
    compiled = {"reply": "The capital is Lyon.", "settings": {**greedy, "compiled_decode": True}}
    assert "compiled step's fused kernels" in compare.replies_note(a, compiled)
    assert "compiled step" not in compare.replies_note(a, {**compiled, "settings": greedy})
    assert compare.replies_note({"reply": ""}, {"reply": ""}) == ""
