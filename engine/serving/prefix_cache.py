"""KV reuse: keep finished sequences' KV caches and serve a request the longest cached prefix.

Design: a flat list of whole sequences per (model, scope), matched by longest common token
prefix. Why not vLLM's hashed blocks or SGLang's radix tree: both share KV *in place* between
sequences, which needs attention that reads scattered blocks (paged attention). Our forward keeps
one contiguous KV buffer per sequence (engine/model/kv_cache.py), so a hit copies the matched prefix into the
request's own buffer — cheap next to the prefill it saves, but a large share of a warm turn's TTFT
(`kv_copy_ms`; `python -m engine.bench kv` prints it; figures in docs/kv-reuse.md). So when a session
continues its own conversation the entry is handed over instead (`Lease.take`): the prompt extends
all of it, no other request holds it and only this session can ever ask for it, so the request
takes the buffer itself, writes past it, and inserts the longer sequence when it ends (which would
have replaced the old entry anyway). On an error the entry goes back into the cache as it was. With a batch of one and a few sessions,
a scan over a handful of entries (vectorized with numpy) costs microseconds, so a tree would buy
nothing but code. What a tree would buy is de-duplication; we get most of it by dropping an entry
when a newer one in its scope extends it (a chat keeps one entry per session, not one per turn).

Life of an entry:
- `lookup` finds the longest match in the request's scope and returns a `Lease`: the source entry
  is pinned (refcount) until the lease is released, and `Lease.copy` gives the request its own
  buffer holding the matched prefix. Entries are never written after insertion, so readers need
  no lock while copying; the pin keeps the entry (and its bytes in the count) alive meanwhile.
- `insert` takes a finished request's cache (handed over, no copy; compacted if it has much unused
  room), evicts least-recently-used unpinned entries until the budget holds, and refuses the entry
  if it cannot fit. The budget counts the real bytes of the KV tensors, so it is never exceeded.

Keys: (model_key, scope, token ids). `key_for(model)` gives each model object its own key, so KV
computed by one model (or quantized variant) is never served to another, nor KV kept at one precision
(`key_for(model, kv)`, the kv_cache_dtype toggle) to a request that asked for another. Scope isolates users: by
default a request sees only its own `session`'s entries — a shared cache would let one user learn
by timing what another's prompt began with (why vLLM added `cache_salt`). `shared=True` opts in to
one scope for everyone (e.g. many users with one long system prompt). A request without a session
gets no reuse unless the cache is shared.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass

import numpy as np


DEFAULT_BUDGET_MB = 512  # MiB; ~22k positions of SmolLM2-135M KV in bf16 (23 KB per position); an engine sizes
# its own from the device (engine/serving/kv_budget.py, `--kv-cache-mb auto`)
SHARED_SCOPE = "*shared*"
# The chat template's preamble with no user content (its default system prompt): the same for every
# user, so one entry serves all of them, and its timing reveals nothing about anyone's prompt. It
# is prefilled by the idle worker (engine/serving/public_prefix.py) and served only when a prompt extends
# all of it; never handed over (it stays for the next user).
PUBLIC_SCOPE = "*public*"
# insert copies a buffer tight when its unused room exceeds this fraction of its bytes. Not less:
# a handed-over buffer's room is where the session's next turn grows without a reallocation.
COMPACT_SLACK = 0.5


@dataclass(eq=False)
class Entry:
    model_key: str
    scope: str
    ids: np.ndarray  # token ids whose KV is held: position i was computed from ids[: i + 1]
    kv: object  # KVCache or HFCache; positions [0, len(ids)) are valid and never written again
    nbytes: int
    last_used: int = 0  # the cache's use counter at the last insert or hit (LRU order)
    pins: int = 0

    @property
    def length(self) -> int:
        return len(self.ids)


class Lease:
    """A request's hold on the entry it was served from: `cached_tokens` of it match the prompt."""

    def __init__(self, cache: PrefixCache, entry: Entry | None, cached_tokens: int):
        self._cache = cache
        self.entry = entry
        self.cached_tokens = cached_tokens

    def copy(self, capacity: int):
        """A new KV buffer with the matched prefix, room for `capacity` positions (None on a miss)."""
        if self.entry is None or self.cached_tokens == 0:
            return None
        return self.entry.kv.copy_prefix(self.cached_tokens, capacity)

    def take(self, capacity: int):
        """The entry's own buffer grown to `capacity`, the entry leaving the cache — if the prompt
        extends all of it, this lease is its only holder and its scope a session's (a shared
        scope's entry may serve other users meanwhile); else None (then `copy`)."""
        entry = self.entry
        if entry is None or self.cached_tokens != entry.length or not self._cache._take(entry):
            return None
        self.entry = None  # nothing left to unpin: the entry is gone
        kv = entry.kv
        kv.ensure_capacity(capacity)
        return kv

    def release(self) -> None:
        if self.entry is not None:
            self._cache._unpin(self.entry)
            self.entry = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class PrefixCache:
    def __init__(self, budget_mb: float = DEFAULT_BUDGET_MB, shared: bool = False, budget_source: str | None = None):
        if budget_mb < 0:
            raise ValueError(f"the KV cache budget must be >= 0 MiB, not {budget_mb}")
        self.budget_bytes = int(budget_mb * 2**20)
        self.budget_source = budget_source or f"{budget_mb:g} MiB, given in code"  # engine info: where it came from
        self.shared = shared
        self._entries: dict[tuple[str, str], list[Entry]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._model_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._key_ids = itertools.count(1)
        self._tick = itertools.count(1)  # a use counter: exact LRU order, unlike clock readings
        self._dead_keys: list[str] = []  # models garbage-collected; their entries go at the next call
        self._counts = dict(lookups=0, hits=0, query_tokens=0, hit_tokens=0, inserts=0, evictions=0,
                            rejected=0, replaced=0, compactions=0, handovers=0)

    # --- keys ------------------------------------------------------------------------------
    def key_for(self, model, kv: str = "model") -> str:
        """A key unique to this model object for the cache's life (ids of dead objects get reused;
        these never are), and to the KV precision `kv` (the kv_cache_dtype toggle) but the model's own.
        Entries of a model that is garbage-collected are dropped with it."""
        if kv != "model":
            return f"{self.key_for(model)}/kv={kv}"
        with self._lock:
            key = self._model_keys.get(model)
            if key is None:
                key = f"{type(model).__name__}#{next(self._key_ids)}"
                self._model_keys[model] = key
                # Only note it: a finalizer may run inside any call, even one holding the lock.
                weakref.finalize(model, self._dead_keys.append, key)
            return key

    def scope_for(self, session: str | None) -> str | None:
        """The scope a request's entries live in; None: this request gets no reuse."""
        if self.shared:
            return SHARED_SCOPE
        return None if session is None else f"session:{session}"

    # --- lookup ----------------------------------------------------------------------------
    def lookup(self, model_key: str, scope: str | None, prompt_ids, max_tokens: int | None = None) -> Lease:
        """The longest cached prefix of `prompt_ids` in this scope (at most `max_tokens`), pinned."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        limit = len(prompt) if max_tokens is None else max(0, min(max_tokens, len(prompt)))
        with self._lock:
            self._forget_dead_models()
            self._counts["lookups"] += 1
            self._counts["query_tokens"] += len(prompt)
            best, best_n = None, 0
            for entry in self._entries.get((model_key, scope), ()) if scope is not None else ():
                n = min(common_prefix_length(entry.ids, prompt), limit)
                if n > best_n or (n == best_n and n > 0 and entry.last_used > best.last_used):
                    best, best_n = entry, n
            for entry in self._entries.get((model_key, PUBLIC_SCOPE), ()):  # whole, or not at all
                n = min(common_prefix_length(entry.ids, prompt), limit)
                if n == entry.length and n > best_n:
                    best, best_n = entry, n
            if best is None:
                return Lease(self, None, 0)
            best.pins += 1
            best.last_used = next(self._tick)
            self._counts["hits"] += 1
            self._counts["hit_tokens"] += best_n
            return Lease(self, best, best_n)

    def _unpin(self, entry: Entry) -> None:
        with self._lock:
            entry.pins -= 1

    def _take(self, entry: Entry) -> bool:
        """Remove `entry` for the one lease pinning it, if its scope is a session's."""
        with self._lock:
            if entry.pins != 1 or entry.scope in (SHARED_SCOPE, PUBLIC_SCOPE) or entry not in self._entries.get(
                    (entry.model_key, entry.scope), ()):
                return False
            entry.pins = 0
            self._remove(entry)
            self._counts["handovers"] += 1
            return True

    # --- insert / evict --------------------------------------------------------------------
    def insert(self, model_key: str, scope: str | None, ids, kv) -> bool:
        """Keep `kv`, whose first len(ids) positions hold the KV of `ids`. The cache takes the
        buffer over: the caller must not write to it again. Returns whether it was kept."""
        if scope is None or len(ids) == 0:
            return False
        ids = np.asarray(ids, dtype=np.int64)
        kv, compacted = _compacted(kv, len(ids))  # outside the lock: it may copy
        size = _real_bytes(kv)
        with self._lock:
            self._forget_dead_models()
            self._counts["compactions"] += compacted
            bucket = list(self._entries.get((model_key, scope), ()))
            for old in bucket:
                if old.length >= len(ids) and common_prefix_length(old.ids, ids) == len(ids):
                    old.last_used = next(self._tick)  # already held by a longer entry
                    return True
            # Entries the new one extends are redundant; drop them (unless a request holds them).
            for old in [o for o in bucket if o.pins == 0 and common_prefix_length(o.ids, ids) == o.length]:
                self._remove(old)
                self._counts["replaced"] += 1
            if not self._make_room(size):
                self._counts["rejected"] += 1
                return False
            self._entries.setdefault((model_key, scope), []).append(Entry(model_key, scope, ids, kv, size, next(self._tick)))
            self._bytes += size
            self._counts["inserts"] += 1
            return True

    def set_budget(self, budget_mb: float, source: str) -> tuple[float, str]:
        """A new budget, at once: least-recently-used unpinned entries go until it holds (pinned ones
        stay until released; inserts then evict). Returns the old (MiB, source), to put it back: a
        load run's KV budget knob (server/load/reuse.py)."""
        if budget_mb < 0:
            raise ValueError(f"the KV cache budget must be >= 0 MiB, not {budget_mb}")
        with self._lock:
            old = (self.budget_bytes / 2**20, self.budget_source)
            self.budget_bytes, self.budget_source = int(budget_mb * 2**20), source
            for victim in sorted((e for b in self._entries.values() for e in b if e.pins == 0),
                                 key=lambda e: e.last_used):
                if self._bytes <= self.budget_bytes:
                    break
                self._remove(victim)
                self._counts["evictions"] += 1
            return old

    def _make_room(self, size: int) -> bool:
        """Evict least-recently-used unpinned entries until `size` more bytes fit (caller holds the lock)."""
        if size > self.budget_bytes:
            return False
        if self._bytes + size <= self.budget_bytes:
            return True
        victims = sorted((e for b in self._entries.values() for e in b if e.pins == 0), key=lambda e: e.last_used)
        freeable = sum(e.nbytes for e in victims)
        if self._bytes - freeable + size > self.budget_bytes:
            return False  # pinned entries hold too much: evict nothing, keep what is there
        for victim in victims:
            if self._bytes + size <= self.budget_bytes:
                break
            self._remove(victim)
            self._counts["evictions"] += 1
        return True

    def _remove(self, entry: Entry) -> None:
        bucket = self._entries[(entry.model_key, entry.scope)]
        bucket.remove(entry)
        if not bucket:
            del self._entries[(entry.model_key, entry.scope)]
        self._bytes -= entry.nbytes

    def _forget_dead_models(self) -> None:
        while self._dead_keys:
            dead = self._dead_keys.pop()
            for e in [e for b in self._entries.values() for e in b if _of_model(e.model_key, dead) and e.pins == 0]:
                self._remove(e)

    def drop(self, model_key: str | None = None, scope: str | None = None) -> int:
        """Forget the unpinned entries of a model and/or a scope (both None: everything)."""
        with self._lock:
            doomed = [e for b in self._entries.values() for e in b if e.pins == 0
                      and (model_key is None or _of_model(e.model_key, model_key)) and (scope is None or e.scope == scope)]
            for e in doomed:
                self._remove(e)
            return len(doomed)

    # --- figures ---------------------------------------------------------------------------
    def has_public(self, model_key: str) -> bool:
        with self._lock:
            return bool(self._entries.get((model_key, PUBLIC_SCOPE)))

    def entries(self) -> list[Entry]:
        with self._lock:
            return [e for b in self._entries.values() for e in b]

    def stats(self) -> dict:
        """Figures for the page and API. Hit rates: vLLM counts tokens (hit_tokens / query_tokens)."""
        with self._lock:
            self._forget_dead_models()
            c = dict(self._counts)
            entries = [e for b in self._entries.values() for e in b]
            return {
                "entries": len(entries),
                "bytes": self._bytes,
                "budget_bytes": self.budget_bytes,
                "budget_source": self.budget_source,
                "cached_positions": sum(e.length for e in entries),
                "pinned": sum(1 for e in entries if e.pins),
                "shared": self.shared,
                "token_hit_rate": c["hit_tokens"] / c["query_tokens"] if c["query_tokens"] else 0.0,
                "request_hit_rate": c["hits"] / c["lookups"] if c["lookups"] else 0.0,
                **c,
            }


def _of_model(entry_key: str, model_key: str) -> bool:
    """Whether an entry's key is the model's (at any KV precision: key_for)."""
    return entry_key == model_key or entry_key.startswith(model_key + "/kv=")


def _compacted(kv, length: int):
    """Drop positions past `length` and, if the buffer has much unused room, copy it tight."""
    if kv.length > length:
        kv.crop(length)
    allocated, used = _real_bytes(kv), kv.nbytes(length)
    if allocated - used > COMPACT_SLACK * allocated:
        return kv.copy_prefix(length), True
    return kv, False


def _real_bytes(kv) -> int:
    """Bytes the buffer really holds: allocated room, not only the positions in use."""
    return kv.allocated_bytes()
