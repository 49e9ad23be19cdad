"""The worker: FIFO order, queue time, cancellation, and bad input that fails alone."""

import threading

import pytest
from support import ask, cancel_once_streaming

from engine.core.config import GenerationConfig
from engine.core.errors import ContextOverflow, InvalidRequest
from engine.core.request import Request
from engine.serving.decoding import Decoding
from engine.serving.worker import Worker

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=8)


def test_requests_run_in_arrival_order_and_queue_time_is_measured(bundled_engine):
    handles = [bundled_engine.submit(ask(f"Say the number {i}."), GREEDY) for i in range(3)]
    finals = [h.result(timeout=120) for h in handles]
    tls = [f.timeline for f in finals]
    assert [t.queue_position for t in tls] == [0, 1, 2]
    for earlier, later in zip(tls, tls[1:]):
        assert later.started_ns >= earlier.done_ns  # one at a time, first come first served
        assert later.enqueued_ns <= earlier.done_ns  # ...so it waited, and its queue_ms says so
        assert later.queue_ms >= (earlier.done_ns - max(later.enqueued_ns, earlier.started_ns)) / 1e6


def test_events_stream_and_chunks_are_stamped_out(bundled_engine):
    h = bundled_engine.submit(ask("Name a color."), GREEDY)
    kinds = [e.kind for e in h.events(timeout=120)]
    assert kinds[0] == "status" and kinds[-1] == "done" and "chunk" in kinds
    tl = h.timeline
    assert len(tl.chunk_out_ns) == kinds.count("chunk")
    assert tl.chunk_out_ns[0] >= tl.token_ns[0]
    assert tl.ttft_ms <= tl.e2e_ms


def test_cancel_while_streaming_frees_the_worker(bundled_engine):
    h = bundled_engine.submit(ask("Write a very long story about a dragon."),
                              GenerationConfig(temperature=0.0, max_new_tokens=400))
    cancel_once_streaming(h)
    assert h.final.detail["finish_reason"] == "cancelled"
    assert h.final.output_tokens < 400
    after = bundled_engine.complete(ask("Say hi."), GREEDY)  # the worker still serves
    assert after.output_tokens > 0


def test_cancel_while_queued_never_runs(bundled_engine):
    blocker = bundled_engine.submit(ask("Write a poem."), GenerationConfig(temperature=0.0, max_new_tokens=30))
    queued = bundled_engine.submit(ask("Write another poem."), GREEDY)
    queued.cancel()
    final = queued.result(timeout=120)
    blocker.result(timeout=120)
    assert final.detail["finish_reason"] == "cancelled" and final.output_tokens == 0


@pytest.mark.parametrize("config, param", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=-3), "max_new_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(seed=-5), "seed"),
    (dict(stop=("",)), "stop"),
    (dict(speculative="magic"), "speculative"),
])
def test_bad_sampling_values_are_refused_with_the_field_named(bundled_engine, config, param):
    with pytest.raises(InvalidRequest) as err:
        bundled_engine.submit(ask("hello"), GenerationConfig(**config))
    assert err.value.param == param and param in str(err.value)


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "   \n "}],
    [],
    [{"role": "wizard", "content": "hi"}],
    [{"role": "user"}],
])
def test_empty_or_malformed_prompts_fail_alone(bundled_engine, messages):
    with pytest.raises(InvalidRequest) as err:  # refused when the Request is made, before it is queued
        bundled_engine.submit(messages, GREEDY)
    assert err.value.param == "messages"
    assert bundled_engine.complete(ask("Say ok."), GREEDY).output_tokens > 0


def test_prompt_longer_than_the_context_window(bundled_engine):
    long_text = "word " * (bundled_engine.loaded.max_context + 100)
    with pytest.raises(ContextOverflow, match="context window"):
        bundled_engine.complete(ask(long_text), GREEDY)


def test_max_new_tokens_beyond_the_context(bundled_engine):
    cfg = GenerationConfig(max_new_tokens=bundled_engine.loaded.max_context)
    with pytest.raises(ContextOverflow, match="at most"):
        bundled_engine.complete(ask("hi"), cfg)


def test_an_engine_crash_fails_only_its_request(bundled):
    calls = []

    class Exploding(Decoding):
        def step(self):
            if not calls:
                calls.append(1)
                raise RuntimeError("forced failure")
            return super().step()

    worker = Worker(bundled, decoding_factory=Exploding)
    try:
        bad = worker.submit(Request(messages=ask("hello"), config=GREEDY))
        with pytest.raises(RuntimeError, match="forced failure"):
            bad.result(timeout=60)
        assert "internal error" in bad.final.detail["message"]
        good = worker.submit(Request(messages=ask("hello"), config=GREEDY)).result(timeout=60)
        assert good.output_tokens > 0 and worker.failed == 1
    finally:
        worker.close()


def test_handles_from_many_threads_each_get_their_own_reply(bundled_engine):
    texts = {}

    def client(i):
        texts[i] = bundled_engine.complete(ask(f"Repeat after me: token{i}"), GREEDY).text

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    solo = {i: bundled_engine.complete(ask(f"Repeat after me: token{i}"), GREEDY).text for i in range(4)}
    assert texts == solo
