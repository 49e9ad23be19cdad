"""KV reuse's sessions: a conversation's states, and an entry taken by a request going back whole
(after an error) or copied (a shared scope, a pinned or partly matched entry)."""


import numpy as np
import pytest
from kv_support import filled_kv, held_ids, plain, run

from engine.core.errors import InvalidRequest
from engine.serving.decoding import Decoding
from engine.serving.generate import build_prompt_ids
from engine.serving.prefix_cache import PrefixCache, common_prefix_length
from engine.serving.sessions import Conversation

# --- sessions ---------------------------------------------------------------------------------------

def test_conversation_state_transitions():
    conv = Conversation("s", system="sys")
    with pytest.raises(InvalidRequest):
        conv.regenerate()
    msgs = conv.send("hi")
    assert msgs == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest, match="no reply yet"):
        conv.send("again")

    class Done:
        text, token_ids, detail, timeline = "\nHello!", [1, 2, 3], {"finish_reason": "stop"}, None

    reply = conv.add_reply(Done)
    assert reply.content == "\nHello!" and reply.token_ids == [1, 2, 3]  # exactly as generated
    assert conv.regenerate() == msgs and not any(m.role == "assistant" for m in conv.messages)
    conv.add_reply(Done)
    conv.send("next")
    assert conv.edit(2, "changed")[-1] == {"role": "user", "content": "changed"}
    assert conv.edit(1, "typed reply") is None and conv.messages[-1].token_ids is None
    with pytest.raises(InvalidRequest):
        conv.edit(5, "x")
    conv.send("q")
    conv.drop_unanswered()
    assert conv.messages[-1].role == "assistant"
    conv.clear()
    assert conv.request_messages() == [{"role": "system", "content": "sys"}]


def test_a_taken_entry_goes_back_whole_after_an_error(bundled):
    cache = PrefixCache()
    conv = Conversation("s")
    conv.add_reply(run(bundled, cache, messages=conv.send("Tell me about owls.")))
    (entry,) = cache.entries()
    before = held_ids(cache)
    messages = conv.send("And about bats?")
    prompt = build_prompt_ids(bundled.tokenizer, messages)
    assert common_prefix_length(entry.ids, np.asarray(prompt)) == entry.length  # the prompt extends all of it

    class Exploding(Decoding):
        def step(self):
            raise RuntimeError("forced failure")

    with pytest.raises(RuntimeError, match="forced failure"):
        run(bundled, cache, messages=messages, decoding_factory=Exploding)
    assert cache.stats()["handovers"] == 1
    assert held_ids(cache) == before and cache.stats()["pinned"] == 0
    done = run(bundled, cache, messages=messages)  # served from the entry that came back
    assert done.timeline.cached_tokens == entry.length and done.timeline.counters.kv.kv_handover == "taken"
    assert done.token_ids == plain(bundled, messages=messages).token_ids


def test_a_shared_scope_copies_and_keeps_its_entry():
    cache = PrefixCache(shared=True)
    kv = filled_kv(6)
    cache.insert("m", cache.scope_for(None), list(range(6)), kv)
    with cache.lookup("m", cache.scope_for(None), list(range(9))) as lease:
        assert lease.cached_tokens == 6 and lease.take(12) is None  # other users may want it meanwhile
        copy = lease.copy(12)
    assert copy is not kv and copy.length == 6 and held_ids(cache) == [list(range(6))]


def test_a_pinned_or_partly_matched_entry_is_copied():
    cache = PrefixCache()
    scope = cache.scope_for("s")
    cache.insert("m", scope, list(range(6)), filled_kv(6))
    with cache.lookup("m", scope, [0, 1, 2, 3, 9]) as partial:  # diverges at position 4
        assert partial.cached_tokens == 4 and partial.take(8) is None
    first, second = cache.lookup("m", scope, list(range(8))), cache.lookup("m", scope, list(range(8)))
    assert first.take(8) is None  # two requests hold it: neither may take it
    second.release()
    taken = first.take(8)
    assert taken is not None and taken.length == 6 and taken.capacity >= 8 and cache.entries() == []
    first.release()
    assert cache.stats()["pinned"] == 0 and cache.stats()["bytes"] == 0
