"""Timeline metrics from synthetic timestamps (engine-free)."""

import json

from engine.core.timeline import Timeline

MS = 1_000_000


def make_timeline():
    tl = Timeline(request_id="r1", received_ns=0)
    tl.enqueued_ns = 1 * MS
    tl.started_ns = 5 * MS
    tl.setup_done_ns = 7 * MS
    tl.prefill_start_ns = 7 * MS
    tl.add_tokens(1, 20 * MS)  # first token
    tl.add_tokens(3, 30 * MS)  # a speculative step: three tokens at one instant
    tl.add_tokens(1, 50 * MS)
    tl.add_chunk_out(1, 21 * MS)
    tl.add_chunk_out(4, 31 * MS)
    tl.add_chunk_out(5, 52 * MS)
    tl.done_ns = 51 * MS
    tl.prompt_tokens, tl.cached_tokens, tl.prefill_tokens = 10, 4, 6
    return tl


def test_glossary_metrics_follow_their_events():
    m = make_timeline().metrics()
    assert m["queue_ms"] == 4.0
    assert m["setup_ms"] == 2.0
    assert m["prefill_ms"] == 13.0
    assert m["ttft_ms"] == 20.0
    assert m["e2e_ms"] == 52.0  # last chunk handed to the transport, not the engine's end
    assert m["output_tokens"] == 5
    assert m["tpot_ms"] == (50 - 20) / 4
    assert abs(m["decode_tps"] - 4 / 0.030) < 1e-9


def test_speculative_tokens_share_a_time_and_itl_counts_them():
    tl = make_timeline()
    assert tl.itl_ms == [10.0, 0.0, 0.0, 20.0]
    assert len(tl.itl_ms) == tl.output_tokens - 1


def test_e2e_falls_back_to_engine_end_without_transport():
    tl = make_timeline()
    tl.chunk_out_ns.clear()
    assert tl.e2e_ms == 51.0


def test_missing_events_give_none_not_errors():
    tl = Timeline(received_ns=0)
    m = tl.metrics()
    assert m["ttft_ms"] is None and m["tpot_ms"] is None and m["decode_tps"] is None
    assert "n/a" in tl.summary()


def test_to_dict_is_json_and_relative_to_arrival():
    d = json.loads(json.dumps(make_timeline().to_dict()))
    assert d["events_ms"]["received"] == 0.0
    assert d["token_ms"] == [20.0, 30.0, 30.0, 30.0, 50.0]
    assert d["chunk_tokens"] == [1, 4, 5]
    assert d["ttft_ms"] <= d["e2e_ms"]


def test_single_token_reply_has_no_tpot():
    tl = Timeline(received_ns=0)
    tl.add_tokens(1, 5 * MS)
    assert tl.tpot_ms is None and tl.decode_tps is None and tl.ttft_ms == 5.0
