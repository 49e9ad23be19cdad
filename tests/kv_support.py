"""Helpers of the KV-reuse tests (test_prefix_cache*.py): one request through `generate` with a prefix
cache, its reference with reuse off, and synthetic caches."""

from engine.core.config import GenerationConfig
from engine.core.request import Request
from engine.core.timeline import Timeline
from engine.model.kv_cache import KVCache
from engine.serving.decoding import Decoding
from engine.serving.generate import generate
from engine.serving.prefix_cache import PrefixCache
from engine.bench import runner_for

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=10)


def run(lm, cache, *, messages=None, prompt_ids=None, session="s", config=GREEDY, should_stop=lambda: False,
        decoding_factory=Decoding):
    tl = Timeline()
    tl.enqueued_ns = tl.started_ns = tl.received_ns
    events = generate(runner_for(lm), lm.tokenizer, lm.eos_token_ids,
                      Request(messages=messages, prompt_ids=prompt_ids, config=config, session=session), tl,
                      should_stop=should_stop, decoding_factory=decoding_factory, prefix_cache=cache)
    for event in events:
        pass
    return event


def plain(lm, cache=None, **kw):
    """The same request with KV reuse off: the reference every reuse result must equal."""
    return run(lm, cache, config=kw.pop("config", GREEDY).replace(kv_reuse=False), **kw)


def filled_kv(n, layers=2, kv_heads=2, head_dim=8):
    """A synthetic cache with n valid positions and no spare room."""
    import torch

    kv = KVCache(layers, kv_heads, head_dim, n, torch.float32, torch.device("cpu"))
    kv.length = n
    return kv


def held_ids(cache: PrefixCache) -> list[list[int]]:
    return [e.ids.tolist() for e in cache.entries()]
