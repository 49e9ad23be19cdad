"""One request's use of the prefix cache (engine/serving/prefix_cache.py): where the decode loop
(engine/serving/generate.py) looks up its prompt, takes or copies the matched KV, and hands the finished
sequence back."""

from __future__ import annotations

from engine.core import clock
from engine.core.counters import KvReuseCounters
from engine.serving.prefix_cache import PUBLIC_SCOPE, Lease, PrefixCache


class RequestReuse:
    """One request's use of the prefix cache: the seams of the decode loop.

    At setup it looks up the prompt and takes over (a session's own entry) or copies the matched
    KV (`kv`, `cached_tokens`, `handover`); at the end `keep(decoding)` hands the finished
    sequence's KV to the cache (also after a cancel: the sequence is consistent between steps);
    `release()` (always, in a finally) unpins the source entry, and after an error puts a taken
    entry back, so the cache holds what it held before.
    `mode` says what happened: off (toggle), no_session, session, shared, no_cache. Every mode but
    off and no_cache may be served the public preamble (`public`, counter `kv_from`).
    """

    def __init__(self, cache: PrefixCache | None, model, session: str | None, enabled: bool,
                 prompt_ids: list[int], capacity: int, kv: str = "model"):
        self.cache = cache
        self.kv, self.cached_tokens, self.copy_ms, self.kept = None, 0, 0.0, False
        self.handover: str | None = None  # "taken" (the entry's own buffer) or "copied"
        self.public = False  # served from the public preamble's entry (PUBLIC_SCOPE)
        self._taken_ids = None  # the matched prefix's ids while this request owns a taken buffer
        self.lease: Lease | None = None
        self.scope = cache.scope_for(session) if cache is not None else None
        if cache is None:
            self.mode = "no_cache"
        elif not enabled:
            self.mode = "off"
        elif self.scope is None:
            self.mode = "no_session"
        else:
            self.mode = "shared" if cache.shared else "session"
        if self.mode not in ("session", "shared", "no_session"):
            return
        self.model_key = cache.key_for(model, kv)  # KV of another precision is never served
        if self.mode == "no_session" and not cache.has_public(self.model_key):
            return  # nothing this request could be served: no reuse (and no lookup counted), as before
        # At least the last prompt token must run through the model to give the first logits.
        self.lease = cache.lookup(self.model_key, self.scope, prompt_ids, max_tokens=len(prompt_ids) - 1)
        t0 = clock.now_ns()
        self.kv = self.lease.take(capacity)
        if self.kv is not None:
            self.handover, self._taken_ids = "taken", list(prompt_ids[: self.lease.cached_tokens])
        else:
            self.kv = self.lease.copy(capacity)
            self.handover = "copied" if self.kv is not None else None
        # the copy is asynchronous on a GPU: time all of it
        self.copy_ms = (clock.done_ns(getattr(model, "device", None)) - t0) / 1e6
        self.cached_tokens = self.lease.cached_tokens if self.kv is not None else 0
        self.public = self.lease.entry is not None and self.lease.entry.scope == PUBLIC_SCOPE

    @property
    def active(self) -> bool:
        return self.lease is not None

    def keep(self, decoding) -> bool:
        """Hand the finished sequence's KV to the cache (the decoding loses its cache)."""
        if not self.active or decoding.cache is None:
            return False
        self._taken_ids = None  # the buffer goes back as the longer sequence, not as the prefix
        self.release()  # first, so the entry this request extends can be replaced by it
        valid = min(decoding.cache.length, len(decoding.ids))  # ids[-1] may not have run yet
        kv, decoding.cache = decoding.cache, None
        self.kept = self.cache.insert(self.model_key, self.scope, decoding.ids[:valid], kv)
        return self.kept

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
        if self._taken_ids is not None:  # an error after taking: the entry goes back as it was
            ids, self._taken_ids = self._taken_ids, None
            self.kv.crop(len(ids))
            self.cache.insert(self.model_key, self.scope, ids, self.kv)

    def counters(self) -> KvReuseCounters:
        """The Timeline's `counters.kv` (cached_tokens itself is a Timeline field)."""
        if not self.active:
            return KvReuseCounters(self.mode)
        return KvReuseCounters(self.mode, kv_copy_ms=round(self.copy_ms, 3), kv_handover=self.handover or None,
                               # the template's preamble, prefilled once for everyone
                               kv_from="public_prefix" if self.public else None)
