"""Conversations kept on the server: multi-turn history from the engine's own text, regenerate,
stop, errors that lose nothing, session isolation. Uses the paced test source (no model) for
speed, and the bundled model (fp32) where the real engine matters."""

import asyncio
import concurrent.futures

import pytest

from engine.core.config import GenerationConfig
from engine.core.errors import InvalidRequest
from ui.chat.store import ChatStore
from ui.chat.paced import PacedSource
from ui.compare.sweep import run_sweep, summary


def run(coro):
    """asyncio.run on a thread of its own: the browser tests' Playwright keeps an event loop
    running on the main thread for the whole session."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def collect(store, *args, **kw):
    async def go():
        return [(k, d) async for k, d in store.run_turn(*args, **kw)]
    return run(go())


@pytest.fixture(scope="module")
def paced():
    source = PacedSource(tokens_per_s=2000, prefill_ms=1)
    yield source
    source.close()


def test_a_turn_streams_start_status_chunks_done_and_keeps_history(paced):
    store = ChatStore(paced)
    s = store.new_session()
    events = collect(store, s, "chat", "hello", {"max_new_tokens": 5})
    kinds = [k for k, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and kinds.count("chunk") == 5 and "status" in kinds
    chunks = [d for k, d in events if k == "chunk"]
    assert [c["n"] for c in chunks] == [1, 2, 3, 4, 5]
    assert all(len(c["token_ms"]) == 1 for c in chunks)  # each chunk carries its tokens' server times
    done = events[-1][1]
    assert done["record"]["reply"] == "".join(c["text"] for c in chunks)
    assert store.messages(s, "chat") == [{"role": "user", "content": "hello"},
                                         {"role": "assistant", "content": done["record"]["reply"]}]
    second = collect(store, s, "chat", "again", {"max_new_tokens": 3})
    assert second[-1][1]["record"]["turn"] == 2 and len(store.messages(s, "chat")) == 4


def test_regenerate_replaces_the_last_reply(paced):
    store = ChatStore(paced)
    s = store.new_session()
    collect(store, s, "chat", "first", {"max_new_tokens": 2})
    collect(store, s, "chat", "second", {"max_new_tokens": 2})
    events = collect(store, s, "chat", None, {"max_new_tokens": 4}, regenerate=True)
    msgs = store.messages(s, "chat")
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[2]["content"] == "second" and msgs[3]["content"] == events[-1][1]["record"]["reply"]
    assert events[-1][1]["row"]["output_tokens"] == 4


def test_stop_ends_with_a_cancelled_reply_that_stays_in_the_history():
    slow = PacedSource(tokens_per_s=100, prefill_ms=1)
    store = ChatStore(slow)
    s = store.new_session()

    async def go():
        out = []
        async for kind, data in store.run_turn(s, "chat", "tell me a story", {"max_new_tokens": 500}):
            out.append((kind, data))
            if kind == "chunk" and data["n"] == 3:
                assert store.cancel(s, "chat")
        return out
    try:
        events = run(go())
    finally:
        slow.close()
    done = events[-1][1]
    assert events[-1][0] == "done" and done["row"]["finish_reason"] == "cancelled"
    assert 3 <= done["row"]["output_tokens"] < 500
    assert store.messages(s, "chat")[-1]["content"] == done["record"]["reply"]
    assert store.pane(s, "chat").inflight is None


def test_bad_input_fails_before_streaming_and_loses_nothing(paced):
    store = ChatStore(paced)
    s = store.new_session()
    collect(store, s, "chat", "kept", {"max_new_tokens": 2})
    before = store.messages(s, "chat")
    for args, kw in [(("", {}), {}), (("hi", {"temperature": -3}), {}), (("hi", {"max_new_tokens": 0}), {}),
                     (("hi", {"backend": "nowhere"}), {})]:
        with pytest.raises(InvalidRequest):
            collect(store, s, "chat", *args, **kw)
    assert store.messages(s, "chat") == before
    with pytest.raises(InvalidRequest, match="nothing to regenerate"):
        collect(store, store.new_session(), "chat", None, {}, regenerate=True)


def test_sessions_are_issued_by_the_server_and_isolated(paced):
    store = ChatStore(paced, max_sessions=3)
    a, b = store.new_session(), store.new_session()
    assert a != b and len(a) >= 20
    collect(store, a, "chat", "only in a", {"max_new_tokens": 1})
    assert store.messages(b, "chat") == []
    with pytest.raises(InvalidRequest, match="unknown or expired"):
        store.messages("made-up-id", "chat")
    with pytest.raises(InvalidRequest):
        store.messages("../etc", "chat")
    with pytest.raises(InvalidRequest):
        store.pane(a, "Z")
    for _ in range(3):  # the least recently used session is dropped past the bound
        store.new_session()
    with pytest.raises(InvalidRequest):
        store.messages(a, "chat")


def test_join_timing_fills_the_timeline_client(paced):
    store = ChatStore(paced)
    s = store.new_session()
    done = collect(store, s, "chat", "hi", {"max_new_tokens": 2})[-1][1]
    rid = done["record"]["request_id"]
    reply = store.join_timing(s, rid, {"send_at_ms": 0.0, "arrival_ms": [5.0, 6.0], "arrival_tokens": [1, 2],
                                       "paint_ms": [9.0, 20.0]})
    assert reply.timeline.client["client_ttft_ms"] == 9.0
    assert reply.timeline.to_dict()["client"]["transport_overhead_ms"] == pytest.approx(9.0 - reply.timeline.ttft_ms)
    with pytest.raises(InvalidRequest):
        store.join_timing(s, "req-nope", {})


def test_sweep_counterbalances_a_and_b_over_every_turn(paced):
    store = ChatStore(paced)
    prompt_set = {"items": [{"history": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                             "turns": ["one", "two"]}, {"turns": ["three"]}]}
    seen = []
    rows = run(run_sweep(store, prompt_set, {"max_new_tokens": 2}, {"max_new_tokens": 3},
                                 progress=lambda d, t, desc: seen.append((d, t))))
    # the warm-up pair (item 0: the first item again), then item 1 A first, item 2 B first (ABBA)
    assert [(r["item"], r["pane"]) for r in rows] == [(0, "A"), (0, "A"), (0, "B"), (0, "B"), (1, "A"), (1, "A"),
                                                      (1, "B"), (1, "B"), (2, "B"), (2, "A")]
    assert [r["output_tokens"] for r in rows if r["pane"] == "B"] == [3, 3, 3, 3, 3]
    assert seen[-1] == (10, 10)
    s = {row["metric"]: row for row in summary(rows)}
    assert s["output_tokens"]["A p50"] == 2 and s["output_tokens"]["B p50"] == 3
    with pytest.raises(InvalidRequest, match="config A"):
        run(run_sweep(store, prompt_set, {"temperature": -1}, {}))


def test_the_history_is_the_engines_text_token_for_token(bundled_engine):
    """The second turn's prompt holds the first reply exactly as generated, so greedy replies
    equal a direct engine call on the same messages."""
    store = ChatStore(bundled_engine)
    s = store.new_session()
    greedy = {"temperature": 0, "max_new_tokens": 8}
    first = collect(store, s, "chat", "Name a fruit.", greedy)[-1][1]["record"]["reply"]
    second = collect(store, s, "chat", "And a vegetable?", greedy)[-1][1]["record"]["reply"]
    direct = bundled_engine.complete(
        [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": first},
         {"role": "user", "content": "And a vegetable?"}], GenerationConfig(temperature=0.0, max_new_tokens=8))
    assert second == direct.text
