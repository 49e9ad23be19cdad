"""`--api-key` for every route of the app: the API, the page, its /lab endpoints, Gradio's own.

One ASGI middleware checks each request before any route sees it. A client proves the key with
`Authorization: Bearer KEY` (the openai SDK, curl, the page's own fetches once logged in carry the
cookie instead) or with the cookie that `POST /login` sets after a small form took the key. The
cookie holds an HMAC of the key, never the key; it is HttpOnly and SameSite=Strict. Open without
the key: `/health` and `/metrics` (as vLLM leaves them, for load balancers and Prometheus) and the
login form itself. Refusals: a browser asking for a page is sent to the form (303); anything else
gets a 401 with an OpenAI-shaped error body.
"""

from __future__ import annotations

import hashlib
import hmac
import html
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, quote, urlsplit

COOKIE = "latency_lab_auth"
OPEN_PATHS = frozenset({"/health", "/metrics", "/login"})
MAX_LOGIN_BODY = 4096
REFUSAL = (b'{"error":{"message":"missing or incorrect API key: send the header \'Authorization: Bearer <key>\' '
           b'(or log in at /login)","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}')


def cookie_token(api_key: str) -> str:
    return hmac.new(api_key.encode(), b"latency-lab page session", hashlib.sha256).hexdigest()


class APIKeyAuth:
    """Refuses every request that does not carry the key, except OPEN_PATHS. `on_refuse()` is
    called for each refusal (the API counts them in /metrics)."""

    def __init__(self, app, api_key: str, on_refuse=None):
        self.app = app
        self.key = api_key.encode()
        self.token = cookie_token(api_key).encode()
        self.on_refuse = on_refuse

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path == "/login" and scope["type"] == "http":
            return await self._login(scope, receive, send)
        if path in OPEN_PATHS or self._authorized(scope):
            return await self.app(scope, receive, send)
        if self.on_refuse is not None:
            self.on_refuse()
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        headers = dict(scope.get("headers") or ())
        wants_page = scope.get("method") == "GET" and b"text/html" in headers.get(b"accept", b"")
        if wants_page:
            target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
            return await _send(send, 303, b"", [(b"location", f"/login?next={quote(target, safe='')}".encode())])
        await _send(send, 401, REFUSAL, [(b"content-type", b"application/json"),
                                          (b"www-authenticate", b'Bearer realm="latency-lab"')])

    def _authorized(self, scope) -> bool:
        headers = dict(scope.get("headers") or ())
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return True
        raw = headers.get(b"cookie", b"").decode("latin-1")
        try:
            morsel = SimpleCookie(raw).get(COOKIE)
        except Exception:  # a malformed cookie header is no credential
            return False
        return morsel is not None and hmac.compare_digest(morsel.value.encode(), self.token)

    async def _login(self, scope, receive, send):
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        nxt = _safe_next(query.get("next", ["/"])[0])
        if scope.get("method") != "POST":
            return await _send(send, 200, _form(nxt, False), [(b"content-type", b"text/html; charset=utf-8")])
        body, more = b"", True
        while more and len(body) <= MAX_LOGIN_BODY:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        form = parse_qs(body[:MAX_LOGIN_BODY].decode("utf-8", "replace"))
        given = form.get("key", [""])[0].encode()
        nxt = _safe_next(form.get("next", [nxt])[0])
        if not hmac.compare_digest(given, self.key):
            if self.on_refuse is not None:
                self.on_refuse()
            return await _send(send, 401, _form(nxt, True), [(b"content-type", b"text/html; charset=utf-8")])
        cookie = f"{COOKIE}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict"
        await _send(send, 303, b"", [(b"location", nxt.encode()), (b"set-cookie", cookie.encode())])


def _safe_next(target: str) -> str:
    """Only a path on this server (no scheme, no host, no //evil.example) may follow a login."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


def _form(nxt: str, failed: bool) -> bytes:
    note = '<p style="color:#b91c1c">That key is not right.</p>' if failed else ""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Latency Lab: log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family:system-ui,sans-serif;max-width:24rem;margin:4rem auto">
<h1 style="font-size:1.3rem">Latency Lab</h1><p>This server asks for its API key (<code>--api-key</code>).</p>{note}
<form method="post" action="/login"><input type="hidden" name="next" value="{html.escape(nxt)}">
<label>API key <input type="password" name="key" autocomplete="current-password" autofocus required></label>
<button type="submit">Log in</button></form></body></html>""".encode()


async def _send(send, status: int, body: bytes, headers: list) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
