"""The public preamble (engine/serving/public_prefix.py): the chat template's text before any user text,
prefilled once by the idle worker and served to every request with KV reuse on, exactly."""

import pytest
from support import public_preamble

from engine.core.config import GenerationConfig, LoadConfig
from engine.model.loader import load
from engine.serving.generate import build_prompt_ids
from engine.serving.public_prefix import preamble_ids
from engine.serving.service import Engine

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=8)
TURNS = [
    [{"role": "user", "content": "Name three colors of the rainbow."}],
    [{"role": "user", "content": "¿Qué tal?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "Say it again."}],
]


def test_every_default_chat_prompt_starts_with_the_preamble_and_a_custom_system_prompt_does_not(tokenizer):
    ids = preamble_ids(tokenizer)
    assert len(ids) >= 4 and "user" in tokenizer.decode(ids)
    for messages in TURNS:
        assert build_prompt_ids(tokenizer, messages)[: len(ids)] == ids
    custom = build_prompt_ids(tokenizer, [{"role": "system", "content": "You are a pirate."}, *TURNS[0]])
    assert custom[: len(ids)] != ids


@pytest.mark.parametrize("max_batch", [1, 4])
def test_the_idle_worker_prefills_it_once_and_every_request_is_served_it_exactly(tiny_model_dir, max_batch):
    fresh = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
    engine = Engine(fresh, max_batch=max_batch)
    try:
        public = public_preamble(engine)
        key = engine.prefix_cache.key_for(fresh.model)
        for messages in TURNS:
            off = engine.complete(messages, GenerationConfig(temperature=0.0, max_new_tokens=8, kv_reuse=False))
            on = engine.complete(messages, GREEDY)  # no session: before, no reuse at all
            assert off.timeline.cached_tokens == 0 and off.timeline.counters.kv.kv_reuse == "off"
            assert on.timeline.cached_tokens == public and on.timeline.counters.kv.kv_from == "public_prefix"
            assert on.token_ids == off.token_ids  # fp32 greedy: reuse changes no token
        first = engine.complete(TURNS[0], GREEDY, session="tab-1")  # a session's first turn: the preamble
        assert first.timeline.cached_tokens == public and first.timeline.counters.kv.kv_reuse == "session"
        again = engine.complete(TURNS[0], GREEDY, session="tab-1")  # then its own, longer prefix
        assert again.timeline.cached_tokens > public and again.timeline.counters.kv.kv_from is None
        assert engine.prefix_cache.has_public(key)  # served, never handed over: it stays for the next user
        custom = engine.complete([{"role": "system", "content": "You are a pirate."}, *TURNS[0]], GREEDY)
        assert custom.timeline.cached_tokens == 0 and custom.timeline.counters.kv.kv_from is None
        # "user\n" + "\n\n…" tokenizes the preamble's last newline into the user's: whole match or none
        merged = engine.complete([{"role": "user", "content": "\n\nindented?"}], GREEDY)
        assert merged.timeline.cached_tokens == 0
    finally:
        engine.close()


def test_no_budget_no_entry_and_the_engine_still_serves(tiny_model_dir):
    from engine.serving.prefix_cache import PrefixCache

    fresh = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
    engine = Engine(fresh, prefix_cache=PrefixCache(budget_mb=0))
    try:
        done = engine.complete(TURNS[0], GREEDY)
        assert done.timeline.cached_tokens == 0 and done.token_ids
        assert not engine.prefix_cache.has_public(engine.prefix_cache.key_for(fresh.model))
    finally:
        engine.close()
