"""Sessions: the one registry of this server, for the API, the page and the engine.

A session is a prefix-cache scope (engine/serving/prefix_cache.py): requests of one session reuse each
other's KV, and nobody else's. If a client could name any session string, one that guessed another
user's ("demo", "tab-1", a user name) would share their scope and could learn by timing (a fast first
token = a cache hit) what that user's prompts began with. So only ids this registry issued are
accepted, by the API (`POST /v1/sessions`) and by the page (`POST /lab/session`, one per browser tab)
alike: `sess_<128 random bits>.<HMAC of them>` under a secret made at start. Checking one needs no
table; an id from an earlier run of the server is refused, which loses nothing (the KV cache died with
that run). The engine sees `api:<random part>` (`engine_session`), and a page pane
`api:<random part>/<pane>` (ui/chat/store.py): scopes of their own.

What a session keeps besides its scope is kept here too: the page's tab keeps its panes'
conversations and replies (`issue(state)`, `state(id)`), in a bounded table where the least recently
used goes first (never one still busy); an API session keeps nothing (the client holds its history).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict

from engine.core.errors import InvalidRequest

PREFIX = "sess_"
ENGINE_PREFIX = "api:"
_NONCE_BYTES = 16  # 128 bits: not guessable, not enumerable
_MAC_BYTES = 16
MAX_KEPT = 256  # sessions whose state is kept (the page's tabs); past it the least recently used goes


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Sessions:
    def __init__(self, secret: bytes | None = None, keep: int = MAX_KEPT):
        """`keep`: how many sessions' state to keep (a state whose `busy` is true is never dropped)."""
        self._secret = secret or secrets.token_bytes(32)
        self.keep = keep
        self._kept: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def _mac(self, nonce: str) -> str:
        return _b64(hmac.new(self._secret, nonce.encode(), hashlib.sha256).digest()[:_MAC_BYTES])

    def issue(self, state: object | None = None) -> str:
        """A fresh id; `state`: what to keep for it (a page tab's), None: nothing (an API session)."""
        nonce = _b64(secrets.token_bytes(_NONCE_BYTES))
        session_id = f"{PREFIX}{nonce}.{self._mac(nonce)}"
        if state is not None:
            with self._lock:
                self._kept[session_id] = state
                while len(self._kept) > self.keep:
                    old = next((k for k, v in self._kept.items() if not getattr(v, "busy", False)), None)
                    if old is None:
                        break  # every session is busy: keep them all
                    del self._kept[old]
        return session_id

    def engine_session(self, session_id) -> str:
        """The engine's session (prefix-cache scope) for an id this server issued; else InvalidRequest."""
        nonce = self._nonce(session_id)
        if nonce is None:
            raise InvalidRequest(
                "session must be an id this server issued: create one with POST /v1/sessions (sessions scope the "
                "prefix cache, so they cannot be chosen by the client; ids from an earlier run are no longer valid)",
                "session")
        return ENGINE_PREFIX + nonce

    def state(self, session_id):
        """What is kept for `session_id` (it becomes the most recently used); InvalidRequest if none is."""
        with self._lock:
            state = self._kept.get(session_id) if isinstance(session_id, str) else None
            if state is None:
                raise InvalidRequest("unknown or expired session: reload the page", "session")
            self._kept.move_to_end(session_id)
            return state

    def _nonce(self, session_id) -> str | None:
        if (not isinstance(session_id, str) or not session_id.isascii() or not session_id.startswith(PREFIX)
                or len(session_id) > 100):
            return None
        nonce, _, mac = session_id[len(PREFIX):].partition(".")
        if not nonce or not hmac.compare_digest(mac.encode(), self._mac(nonce).encode()):
            return None
        return nonce
