"""Chunked prefill: the same first token and the same greedy output as one forward (fp32), progress
events that rise to the total, Stop between chunks, and the same through the generic forward."""

import pytest

from engine.bench.prefill_chunks import prompt_ids
from engine.core.config import GenerationConfig, LoadConfig
from engine.core.errors import InvalidRequest
from engine.core.request import Request
from engine.core.timeline import Timeline
from engine.serving.decoding import Decoding
from engine.serving.generate import generate
from engine.bench import runner_for


def run(lm, ids, should_stop=lambda: False, **cfg):
    tl = Timeline()
    tl.enqueued_ns = tl.started_ns = tl.received_ns
    request = Request(prompt_ids=ids, config=GenerationConfig(temperature=0.0, **cfg))
    return list(generate(runner_for(lm), lm.tokenizer, lm.eos_token_ids, request, tl, should_stop=should_stop))


def progress_of(events):
    """(prefilled, total) of each prefill progress event, and whether all came before the first chunk."""
    first_chunk = next(i for i, e in enumerate(events) if e.kind in ("chunk", "done"))
    marks = [(i, e.detail["prefilled_tokens"], e.detail["prefill_tokens"]) for i, e in enumerate(events)
             if e.kind == "status" and "prefilled_tokens" in e.detail]
    return [(done, total) for _, done, total in marks], all(i < first_chunk for i, _, _ in marks)


@pytest.fixture(scope="module")
def long_ids(tokenizer):
    return prompt_ids(tokenizer, 520)


@pytest.fixture(scope="module")
def one_forward(bundled, long_ids):
    return run(bundled, long_ids, max_new_tokens=12)


@pytest.mark.parametrize("chunk", [128, 200])
def test_chunked_prefill_gives_the_same_greedy_reply_and_rising_progress(bundled, long_ids, one_forward, chunk):
    events = run(bundled, long_ids, max_new_tokens=12, chunked_prefill=True, prefill_chunk_tokens=chunk)
    done, want = events[-1], one_forward[-1]
    assert done.token_ids[0] == want.token_ids[0]  # the first token
    assert done.token_ids == want.token_ids and done.text == want.text
    progress, before_first_token = progress_of(events)
    total = len(long_ids)
    n_chunks = -(-total // chunk)
    assert progress[0] == (0, total) and progress[-1] == (total, total)  # from nothing to the total
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)  # monotonic
    assert len(progress) == n_chunks + 1 and all(b - a <= chunk for (a, _), (b, _) in zip(progress, progress[1:]))
    assert before_first_token
    tl = done.timeline
    assert tl.prefill_tokens == total and tl.counters.forward_passes == n_chunks + len(done.token_ids) - 1
    assert not progress_of(one_forward)[0]  # one forward: no progress events


def test_chunked_prefill_counts_only_the_tokens_not_already_cached(tiny):
    ids = list(range(100, 400))
    config = GenerationConfig(temperature=0.0, max_new_tokens=4)
    cache = tiny.model.new_cache(400)
    runner_for(tiny).forward(Decoding(runner_for(tiny), ids, config)._tensor(ids[:120]), cache)  # a cached prefix
    dec = Decoding(runner_for(tiny), ids, config, cache=cache, cached_tokens=120)
    assert list(dec.prefill_chunks(64)) == [184, 248, 300]
    chunked = dec.prefill()
    plain = Decoding(runner_for(tiny), ids, config).prefill()
    assert chunked == plain


def test_stop_during_a_chunked_prefill_ends_before_the_first_token(tiny):
    ids = list(range(100, 420))
    seen = []

    def stop():
        return len(seen) >= 2  # after two progress events: the start and the first chunk

    events = []
    tl = Timeline()
    request = Request(prompt_ids=ids, config=GenerationConfig(temperature=0.0, max_new_tokens=8, chunked_prefill=True,
                                                              prefill_chunk_tokens=64))
    for e in generate(runner_for(tiny), tiny.tokenizer, tiny.eos_token_ids, request, tl, should_stop=stop):
        events.append(e)
        if e.kind == "status" and "prefilled_tokens" in e.detail:
            seen.append(e.detail["prefilled_tokens"])
    done = events[-1]
    assert done.kind == "done" and done.detail["finish_reason"] == "cancelled"
    assert done.output_tokens == 0 and done.text == "" and tl.first_token_ns is None
    assert seen == [0, 64] and tl.counters.forward_passes == 1  # the other four chunks never ran


def test_the_generic_transformers_forward_prefills_in_chunks_too(tiny_model_dir):
    from engine.model.loader import load

    hf = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False, fast_path=False))
    ids = list(range(100, 360))
    plain = run(hf, ids, max_new_tokens=6)[-1]
    events = run(hf, ids, max_new_tokens=6, chunked_prefill=True, prefill_chunk_tokens=100)
    assert events[-1].token_ids == plain.token_ids
    assert progress_of(events)[0] == [(0, 260), (100, 260), (200, 260), (260, 260)]


@pytest.mark.parametrize("changes, param", [({"chunked_prefill": "yes"}, "chunked_prefill"),
                                            ({"prefill_chunk_tokens": 8}, "prefill_chunk_tokens"),
                                            ({"prefill_chunk_tokens": 100.0}, "prefill_chunk_tokens")])
def test_bad_chunked_prefill_options_are_refused_by_name(changes, param):
    with pytest.raises(InvalidRequest) as err:
        GenerationConfig(**changes)
    assert err.value.param == param


def test_the_api_takes_chunked_prefill_as_extra_body_fields():
    from server.protocol import parse_chat_request

    body = {"messages": [{"role": "user", "content": "hi"}], "chunked_prefill": True, "prefill_chunk_tokens": 64}
    cfg = parse_chat_request(body).config
    assert cfg.chunked_prefill is True and cfg.prefill_chunk_tokens == 64
    assert parse_chat_request({"messages": body["messages"]}).config.chunked_prefill is False  # off by default
    with pytest.raises(InvalidRequest) as err:
        parse_chat_request({**body, "prefill_chunk_tokens": 0})
    assert err.value.param == "prefill_chunk_tokens"
