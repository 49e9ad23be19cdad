"""API session ids: issued by this server, unguessable, checked without keeping state.

A session is a prefix-cache scope (engine/serving/prefix_cache.py): requests of one session reuse each
other's KV, and nobody else's. If a client could name any session string, one that guessed
another user's ("demo", "tab-1", a user name) would share their scope and could learn by timing
(a fast first token = a cache hit) what that user's prompts began with. So the API accepts only
ids it issued (`POST /v1/sessions`): `sess_<128 random bits>.<HMAC of them>` under a secret made
at start. Checking one needs no table (nothing to grow, nothing to evict); an id from an
earlier run of the server is refused, which loses nothing (the KV cache died with that run).

The engine sees `api:<random part>`: the page's sessions (ui/chat/store.py, random ids without ':')
can never collide with the API's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from engine.core.errors import InvalidRequest

PREFIX = "sess_"
ENGINE_PREFIX = "api:"
_NONCE_BYTES = 16  # 128 bits: not guessable, not enumerable
_MAC_BYTES = 16


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class SessionIds:
    def __init__(self, secret: bytes | None = None):
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, nonce: str) -> str:
        return _b64(hmac.new(self._secret, nonce.encode(), hashlib.sha256).digest()[:_MAC_BYTES])

    def issue(self) -> str:
        nonce = _b64(secrets.token_bytes(_NONCE_BYTES))
        return f"{PREFIX}{nonce}.{self._mac(nonce)}"

    def engine_session(self, session_id) -> str:
        """The engine's session (prefix-cache scope) for an id this server issued; else InvalidRequest."""
        if (not isinstance(session_id, str) or not session_id.isascii() or not session_id.startswith(PREFIX)
                or len(session_id) > 100):
            raise self._refused()
        nonce, _, mac = session_id[len(PREFIX):].partition(".")
        if not nonce or not hmac.compare_digest(mac.encode(), self._mac(nonce).encode()):
            raise self._refused()
        return ENGINE_PREFIX + nonce

    @staticmethod
    def _refused() -> InvalidRequest:
        return InvalidRequest(
            "session must be an id this server issued: create one with POST /v1/sessions (sessions scope the "
            "prefix cache, so they cannot be chosen by the client; ids from an earlier run are no longer valid)",
            "session")
