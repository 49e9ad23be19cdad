"""KV reuse: exactness with and without the prefix cache, isolation, the budget, pins, cancel/error.

End-to-end tests use the fp32 bundled model (greedy paths compared token for token) with short
replies; the budget and pin tests use the tiny random Llama, where a request takes milliseconds.
"""

import random
import threading

import numpy as np
import pytest
from kv_support import GREEDY, filled_kv, held_ids, plain, run

from engine.core.config import GenerationConfig, LoadConfig
from engine.model.loader import load
from engine.serving.decoding import Decoding
from engine.serving.generate import build_prompt_ids
from engine.serving.prefix_cache import PrefixCache, common_prefix_length
from engine.serving.sessions import Conversation


def budget_mb(positions: int, per_position: int) -> float:
    """A budget in MiB that holds exactly `positions` positions (a byte of margin for rounding)."""
    return (positions * per_position + 1) / 2**20


def longest_held_prefix(cache, prompt_ids) -> int:
    p = np.asarray(prompt_ids)
    return max((common_prefix_length(e.ids, p) for e in cache.entries()), default=0)


def assert_budget(cache: PrefixCache):
    """The cache's byte count is the real size of the tensors it holds, and within budget."""
    real = 0
    for e in cache.entries():
        for t in (e.kv.k, e.kv.v):
            real += t.untyped_storage().nbytes()
    s = cache.stats()
    assert s["bytes"] == real
    assert real <= cache.budget_bytes


# --- the bundled model: exactness over conversations ---------------------------------------------

def converse(lm, cache, conv, turns, session="s"):
    """Send each text; check every reply against a no-reuse run; return the done events."""
    dones = []
    for text in turns:
        messages = conv.send(text)
        prompt = build_prompt_ids(lm.tokenizer, messages)
        expect_cached = min(longest_held_prefix(cache, prompt), len(prompt) - 1)
        done = run(lm, cache, messages=messages, session=session)
        before = held_ids(cache)
        ref = plain(lm, cache, messages=messages, session=session)  # the toggle off: cache untouched
        assert held_ids(cache) == before
        assert done.token_ids == ref.token_ids and done.text == ref.text
        tl = done.timeline
        assert tl.cached_tokens == expect_cached
        assert tl.cached_tokens + tl.prefill_tokens == tl.prompt_tokens == len(prompt)
        assert ref.timeline.cached_tokens == 0 and ref.timeline.counters.kv.kv_reuse == "off"
        conv.add_reply(done)
        dones.append(done)
    return dones


def test_multi_turn_conversation_is_identical_and_prefills_only_new_tokens(bundled):
    cache = PrefixCache()
    conv = Conversation("s")
    dones = converse(bundled, cache, conv, ["What is the capital of France?", "And of Italy?", "Which is larger?"])
    assert dones[0].timeline.cached_tokens == 0
    for prev, cur in zip(dones, dones[1:]):
        # The cache holds the previous prompt and reply as generated (its last token was never fed).
        held = prev.timeline.prompt_tokens + prev.output_tokens - 1
        assert cur.timeline.cached_tokens >= held - 2  # re-tokenizing the reply may differ at its end only
        assert cur.timeline.prefill_tokens < cur.timeline.prompt_tokens / 2
        assert cur.timeline.counters.kv.kv_reuse == "session"
        # The session's own entry, all of it a prefix of the prompt: handed over, not copied.
        whole = cur.timeline.cached_tokens == held
        assert cur.timeline.counters.kv.kv_handover == ("taken" if whole else "copied")
    assert len(cache.entries()) == 1  # each turn's entry replaced the one it extends
    assert cache.stats()["handovers"] == sum(d.timeline.counters.kv.kv_handover == "taken" for d in dones) >= 1
    s = cache.stats()
    assert s["hits"] == 2 and s["lookups"] == 3 and 0 < s["token_hit_rate"] < 1


def test_regenerate_reuses_all_but_the_last_prompt_token(bundled):
    cache = PrefixCache()
    conv = Conversation("s", system="You answer in one short sentence.")
    (first,) = converse(bundled, cache, conv, ["Name a primary color."])
    messages = conv.regenerate()
    again = run(bundled, cache, messages=messages)
    assert again.timeline.cached_tokens == again.timeline.prompt_tokens - 1
    assert again.timeline.prefill_tokens == 1
    assert again.token_ids == first.token_ids == plain(bundled, messages=messages).token_ids


def test_editing_an_earlier_message_never_serves_stale_kv(bundled):
    cache = PrefixCache()
    conv = Conversation("s")
    converse(bundled, cache, conv, ["My name is Ada. What is 2 + 2?", "What is my name?"])
    old_prompt = build_prompt_ids(bundled.tokenizer, conv.request_messages())
    messages = conv.edit(0, "My name is Grace. What is 3 + 3?")
    assert [m["role"] for m in messages if m["role"] != "system"] == ["user"]
    new_prompt = build_prompt_ids(bundled.tokenizer, messages)
    diverge = common_prefix_length(np.asarray(old_prompt), np.asarray(new_prompt))
    done = run(bundled, cache, messages=messages)
    assert 0 < done.timeline.cached_tokens <= diverge  # only the part before the edit
    assert done.token_ids == plain(bundled, messages=messages).token_ids
    # and the conversation continues from the edited branch, still exact
    conv.add_reply(done)
    converse(bundled, cache, conv, ["What is my name?"])


def test_sessions_are_isolated_by_default(bundled):
    cache = PrefixCache()
    messages = [{"role": "user", "content": "Say hello to the team."}]
    run(bundled, cache, messages=messages, session="alice")
    bob = run(bundled, cache, messages=messages, session="bob")
    assert bob.timeline.cached_tokens == 0
    anonymous = run(bundled, cache, messages=messages, session=None)
    assert anonymous.timeline.cached_tokens == 0 and anonymous.timeline.counters.kv.kv_reuse == "no_session"
    assert {e.scope for e in cache.entries()} == {"session:alice", "session:bob"}  # nothing kept for None
    alice = run(bundled, cache, messages=messages, session="alice")
    assert alice.timeline.cached_tokens == alice.timeline.prompt_tokens - 1
    assert alice.token_ids == bob.token_ids == anonymous.token_ids


def test_a_shared_cache_serves_one_sessions_prefix_to_another(bundled):
    cache = PrefixCache(shared=True)
    system = {"role": "system", "content": "You are a terse assistant for a hardware store. " * 4}
    alice_messages = [system, {"role": "user", "content": "Do you sell hammers?"}]
    run(bundled, cache, messages=alice_messages, session="alice")
    messages = [system, {"role": "user", "content": "Do you sell nails?"}]
    bob = run(bundled, cache, messages=messages, session="bob")
    shared_start = common_prefix_length(np.asarray(build_prompt_ids(bundled.tokenizer, alice_messages)),
                                        np.asarray(build_prompt_ids(bundled.tokenizer, messages)))
    assert shared_start > 40 and bob.timeline.cached_tokens == shared_start
    assert bob.timeline.counters.kv.kv_reuse == "shared"
    assert bob.token_ids == plain(bundled, messages=messages).token_ids
    anonymous = run(bundled, cache, messages=messages, session=None)  # a shared cache serves everyone
    assert anonymous.timeline.cached_tokens == anonymous.timeline.prompt_tokens - 1


def test_cancel_mid_stream_keeps_a_consistent_entry(bundled):
    cache = PrefixCache()
    conv = Conversation("s")
    messages = conv.send("Write a long story about a lighthouse.")
    chunks = []

    def stop_after_three():
        chunks.append(1)
        return len(chunks) >= 3

    cut = run(bundled, cache, messages=messages, config=GREEDY.replace(max_new_tokens=40), should_stop=stop_after_three)
    assert cut.detail["finish_reason"] == "cancelled" and cut.output_tokens == 3
    prompt = build_prompt_ids(bundled.tokenizer, messages)
    assert held_ids(cache) == [prompt + cut.token_ids[:2]]  # the last sampled token was never fed
    assert cache.stats()["pinned"] == 0
    # Regenerate from the cancelled state, then continue after the partial reply: both exact.
    full = run(bundled, cache, messages=conv.regenerate())
    assert full.token_ids == plain(bundled, messages=messages).token_ids
    assert full.token_ids[:3] == cut.token_ids
    conv.add_reply(cut)
    converse(bundled, cache, conv, ["Go on."])


def test_an_error_mid_stream_keeps_nothing_and_unpins(bundled):
    cache = PrefixCache()
    messages = [{"role": "user", "content": "Tell me about owls."}]
    first = run(bundled, cache, messages=messages)
    before = held_ids(cache)

    class Exploding(Decoding):
        def step(self):
            if self.output_ids:
                raise RuntimeError("forced failure")
            return super().step()

    with pytest.raises(RuntimeError, match="forced failure"):
        run(bundled, cache, messages=messages, decoding_factory=Exploding)
    assert held_ids(cache) == before and cache.stats()["pinned"] == 0
    assert run(bundled, cache, messages=messages).token_ids == first.token_ids


def test_engine_sessions_reuse_and_report_stats(bundled_engine):
    conv = Conversation("engine-test")
    first = bundled_engine.complete(conv.send("Name a fruit."), GREEDY, session=conv.session)
    conv.add_reply(first)
    second = bundled_engine.complete(conv.send("Name another one."), GREEDY, session=conv.session)
    assert second.timeline.cached_tokens >= first.timeline.prompt_tokens
    assert second.timeline.to_dict()["cached_tokens"] == second.timeline.cached_tokens
    stats = bundled_engine.info().prefix_cache
    assert stats["entries"] >= 1 and 0 < stats["bytes"] <= stats["budget_bytes"] and stats["hits"] >= 1
    off = bundled_engine.complete(conv.request_messages(), GREEDY.replace(kv_reuse=False), session=conv.session)
    assert off.timeline.cached_tokens == 0 and off.token_ids == second.token_ids


# --- the tiny model: budget, pins, model identity -------------------------------------------------

def random_prompt(rng, history):
    """A prompt that often continues, or shares the start of, an earlier one of its session."""
    base = []
    if history and rng.random() < 0.7:
        base = rng.choice(history)
        base = base[: rng.randint(1, len(base))] if rng.random() < 0.4 else base
    return (base + [rng.randrange(5, 3000) for _ in range(rng.randint(1, 40))])[-200:]


def test_budget_holds_under_many_random_conversations(tiny):
    per_position = tiny.model.new_cache(1).nbytes(1)
    cache = PrefixCache(budget_mb=budget_mb(300, per_position))  # a few conversations: constant eviction
    rng = random.Random(7)
    histories, reused = {"a": [], "b": [], "c": []}, 0
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=6)
    for _ in range(80):
        session = rng.choice(sorted(histories))
        prompt = random_prompt(rng, histories[session])
        done = run(tiny, cache, prompt_ids=prompt, session=session, config=cfg)
        assert done.token_ids == plain(tiny, prompt_ids=prompt, config=cfg).token_ids
        assert_budget(cache)
        reused += done.timeline.cached_tokens > 0
        histories[session].append(prompt + done.token_ids)
    s = cache.stats()
    assert s["evictions"] > 0 and reused > 10 and s["pinned"] == 0
    assert {e.scope for e in cache.entries()} <= {"session:a", "session:b", "session:c"}


def test_eviction_never_removes_an_entry_in_use(tiny):
    per_position = tiny.model.new_cache(1).nbytes(1)
    cache = PrefixCache(budget_mb=budget_mb(140, per_position))
    prompt = list(range(10, 70))
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=12)
    run(tiny, cache, prompt_ids=prompt, session="mine", config=cfg)
    (source,) = cache.entries()
    flood_rounds = []

    def flood():  # runs between decode steps, while the request holds its lease
        key, r = cache.key_for(tiny.model), len(flood_rounds)
        for i, n in enumerate([30] * 4 + [80]):  # the 80 cannot fit beside the pinned entry: refused
            kv = tiny.model.new_cache(n)
            kv.length = n
            cache.insert(key, f"other{r}-{i}", list(range(1000 + i, 1000 + i + n)), kv)
        flood_rounds.append(1)
        assert source in cache.entries() and source.pins == 1
        assert_budget(cache)
        return False

    longer = prompt + [5, 6, 7]
    done = run(tiny, cache, prompt_ids=longer, session="mine", config=cfg, should_stop=flood)
    assert done.timeline.cached_tokens == len(prompt) and flood_rounds
    assert done.token_ids == plain(tiny, prompt_ids=longer, config=cfg).token_ids
    s = cache.stats()
    assert s["evictions"] > 0 and s["rejected"] > 0 and s["pinned"] == 0
    assert_budget(cache)


def test_pins_from_another_thread_block_eviction():
    """Synthetic entries: a lease taken on one thread keeps its entry while another fills the cache."""
    kv = filled_kv
    cache = PrefixCache(budget_mb=budget_mb(50, kv(1).nbytes(1)))
    assert cache.insert("m", "s", list(range(20)), kv(20))
    lease = cache.lookup("m", "s", list(range(25)))
    assert lease.cached_tokens == 20

    def fill():
        for i in range(20):
            cache.insert("m", f"t{i}", [900 + i] * 10, kv(10))

    t = threading.Thread(target=fill)
    t.start()
    t.join()
    assert lease.entry in cache.entries() and cache.stats()["bytes"] <= cache.budget_bytes
    copy = lease.copy(capacity=40)
    assert copy.length == 20 and copy.capacity == 40
    lease.release()
    fill()
    assert [e.ids.tolist() for e in cache.entries() if e.scope == "s"] == []  # evicted once unpinned
    assert not cache.insert("m", "big", list(range(60)), kv(60))  # larger than the whole budget
    assert cache.stats()["bytes"] <= cache.budget_bytes


def test_lru_order_and_longest_match():
    kv = filled_kv
    cache = PrefixCache(budget_mb=budget_mb(30, kv(1).nbytes(1)))
    cache.insert("m", "s", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], kv(10))
    cache.insert("m", "s", [1, 2, 3, 40, 50, 60, 70, 80, 90, 100], kv(10))
    cache.insert("m", "s", [7] * 10, kv(10))
    with cache.lookup("m", "s", [1, 2, 3, 4, 5, 99]) as lease:  # longest match, and now most recent
        assert lease.cached_tokens == 5 and lease.entry.ids[3] == 4
    with cache.lookup("m", "s", [1, 2, 3, 4, 5], max_tokens=4) as lease:
        assert lease.cached_tokens == 4
    cache.insert("m", "s", [8] * 10, kv(10))  # evicts the least recently used: [1,2,3,40,...]
    assert sorted(e.ids[3] for e in cache.entries()) == [4, 7, 8]
    # An entry extended by a newer one is replaced (then the LRU one makes room: [1..10]);
    # a prefix of an existing entry adds nothing.
    cache.insert("m", "s", [7] * 12, kv(12))
    assert sorted(e.ids.tolist() for e in cache.entries()) == [[7] * 12, [8] * 10]
    assert cache.insert("m", "s", [7] * 5, kv(5)) and len(cache.entries()) == 2
    assert cache.stats()["replaced"] == 1 and cache.stats()["evictions"] == 2
    assert cache.stats()["bytes"] <= cache.budget_bytes


def test_kv_of_one_model_is_never_served_to_another(tiny, tiny_model_dir):
    import gc

    other = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
    cache = PrefixCache()
    prompt = list(range(100, 140))
    run(tiny, cache, prompt_ids=prompt)
    assert cache.key_for(tiny.model) != cache.key_for(other.model)
    assert run(other, cache, prompt_ids=prompt).timeline.cached_tokens == 0
    assert run(tiny, cache, prompt_ids=prompt).timeline.cached_tokens == len(prompt) - 1
    assert len(cache.entries()) == 2
    del other
    gc.collect()
    assert cache.stats()["entries"] == 1  # a model's entries go with it


def test_the_generic_forward_reuses_exactly_too(tiny_model_dir):
    hf = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False, fast_path=False))
    assert not hf.fast_path
    cache = PrefixCache()
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=8)
    history = list(range(200, 230))
    for turn in range(3):
        done = run(hf, cache, prompt_ids=history, config=cfg)
        assert done.token_ids == plain(hf, prompt_ids=history, config=cfg).token_ids
        assert (done.timeline.cached_tokens > 0) == (turn > 0)
        history = history + done.token_ids + [300 + turn, 301, 302]
    assert cache.stats()["bytes"] == sum(e.kv.nbytes() for e in cache.entries())
