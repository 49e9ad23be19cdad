"""A request-size limit for every route of the app: the API, the page's /lab endpoints, Gradio's.

The API's own body reader (api.py `_read_json`) stops at the limit too; this ASGI middleware
covers the routes that parse bodies themselves (FastAPI models, Gradio), so a huge body is refused
before anything buffers it. A declared Content-Length over the limit is refused at once; a body
sent without one (chunked) is counted as it arrives.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a body passes the limit. An HTTPException, so FastAPI's body
    parsing re-raises it as it is (it turns other errors into a 400) and the app answers 413."""

    def __init__(self, max_bytes: int):
        super().__init__(413, f"the request body is larger than {max_bytes // 1024} KiB")


class BodySizeLimit:
    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        seen = 0
        started = False

        async def counted_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if not started:  # nobody answered it on the way out: answer here
                await self._refuse(send)

    async def _refuse(self, send) -> None:
        body = (b'{"error":{"message":"the request body is larger than %d KiB","type":"invalid_request_error",'
                b'"param":null,"code":"request_too_large"}}' % (self.max_bytes // 1024))
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
