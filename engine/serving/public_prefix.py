"""The chat template's public preamble, prefilled once per model for every user.

A chat prompt begins with what the template puts before any user text: for the bundled SmolLM2,
its default system prompt and the user turn's header, 24 of a short first turn's ~34 tokens.
It is the same for everyone, so unlike a user's own prefix its KV can serve all requests
(with KV reuse on, with or without a session) without letting anyone learn anything by timing:
the entry is made by the idle worker before anyone asks (`warm_idle`), so a hit says only that
the template is the template. A custom system prompt does not match it and is prefilled as before.
Entries live in the prefix cache's PUBLIC_SCOPE (engine/serving/prefix_cache.py).
"""

from __future__ import annotations

import logging

import torch
from torch.utils.weak import WeakIdKeyDictionary

from engine.serving.generate import build_prompt_ids
from engine.serving.prefix_cache import PUBLIC_SCOPE

log = logging.getLogger(__name__)
# User texts with different first characters: where the template's text ends, the tokenizer may
# merge its last characters with the user's first; the ids all of them share are the template's.
PROBES = ("a", "Z 1", "\n?", "¿")
MIN_TOKENS = 4  # a shorter preamble is not worth an entry
_TRIED = WeakIdKeyDictionary()  # model -> True once warmed, False where that failed or was refused


def preamble_ids(tokenizer) -> list[int]:
    """The token ids every chat prompt (default system prompt) starts with, whatever the user wrote."""
    runs = [build_prompt_ids(tokenizer, [{"role": "user", "content": text}]) for text in PROBES]
    n = min(len(r) for r in runs)
    for i in range(n):
        if any(r[i] != runs[0][i] for r in runs):
            n = i
            break
    return list(runs[0][:n])


def warm_idle(prefix_cache, variants) -> bool:
    """Prefill the preamble of the next resident variant (`.loaded`, `.runner`) whose model has no public
    entry (the worker's idle work). Returns whether it did one. A model is warmed again if its entry was
    evicted, never after a refusal (e.g. --kv-cache-mb 0) or a failure."""
    if prefix_cache is None:
        return False
    for variant in variants:
        loaded, runner = variant.loaded, variant.runner
        model = runner.model
        key = prefix_cache.key_for(model)
        if _TRIED.get(model) is False or prefix_cache.has_public(key):
            continue
        ok = False
        try:
            ids = preamble_ids(loaded.tokenizer)
            if len(ids) >= MIN_TOKENS and len(ids) < runner.max_context:
                kv = runner.new_cache(len(ids))
                runner.forward(torch.tensor(ids, dtype=torch.long, device=runner.device), kv)
                ok = prefix_cache.insert(key, PUBLIC_SCOPE, ids, kv)
        except Exception:  # e.g. a template that needs more than a user turn: no public entry, nothing else lost
            log.exception("the public preamble could not be prefilled")
        _TRIED[model] = ok
        return True
    return False
