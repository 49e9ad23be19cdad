"""OpenAI-compatible API: `POST /v1/chat/completions` (SSE and not), `GET /v1/models`, `GET /metrics`.

`create_api(engine_or_backends, api_key=None)` returns a FastAPI app. The page mounts into the
same app, so page and API share one port: `gr.mount_gradio_app(app, blocks, path="/")` (our routes
are added first, so they win over the page's catch-all mount). `app.state.backends` holds the
engines wrapped for /metrics: hand those to the page and its requests are counted too.
With `api_key`, every route of the app (the page and /lab included) asks for it, except `/health`
and `/metrics` (server/auth.py: a bearer header, or the cookie of the /login form).

Timing: a request's Timeline starts (`received`) when the handler runs, before the body is read.
A streamed reply is answered with status 200 only once the engine has accepted the request (the
prompt is tokenized and fits), so bad input, context overflow and a full queue are 4xx with an
OpenAI error body, never an error inside a 200 stream. A client that goes away — while queued,
while waiting for its first token, or mid-stream — cancels its generation at once.

Sessions (`session`, the prefix-cache scope) are issued by `POST /v1/sessions` and checked by
server/sessions.py: a client cannot choose one, so it cannot guess its way into another's cache.
Queueing shows in `X-Queue-Position` / `X-Queue-Ms` headers, `timings.queue_ms`, and `GET /v1/queue`.

Traces (docs/trace.md): `GET /v1/trace/{id}` (the X-Request-Id or the completion id) answers a finished
request's Chrome Trace Event JSON (server/tracing.py); `?trace=true` on the chat request puts it in the
reply's `timings.trace`. With `otlp_endpoint`, every request is exported as OpenTelemetry spans, and a
W3C `traceparent` header continues the caller's trace.

Streaming uses Starlette's own `StreamingResponse` rather than sse-starlette: OpenAI's framing is
only `data: JSON\\n\\n` lines, Starlette already stops the stream when the client leaves, and one
try/finally (`_CancelWhenDone`) cancels the generation however the response ends (finished, client
gone, failed); sse-starlette's pings and callbacks would not replace any of that.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from engine.core.errors import LatencyLabError
from engine.core.timeline import Timeline
from engine.measure.trace import chrome_trace

from .auth import APIKeyAuth
from .limits import BodySizeLimit
from .metrics import Metrics
from .protocol import (
    APIError,
    api_error_from,
    chunk_body,
    completion_body,
    in_api_terms,
    metrics_of,
    new_completion_id,
    now_s,
    parse_chat_request,
    sse,
    timings_of,
    usage_of,
)
from .sessions import Sessions
from .tracing import RequestTraces

MAX_BODY_BYTES = 2 * 1024 * 1024  # far beyond any prompt that fits the context; refuses memory abuse
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering


def create_api(engine_or_backends, *, api_key: str | None = None, metrics: Metrics | None = None,
               sessions: Sessions | None = None, otlp_endpoint: str | None = None, otlp=None) -> FastAPI:
    """The API app over one engine or a {model name: engine} dict (local `Engine` or `RemoteEngine`).
    `otlp_endpoint` (or an `OtlpExport`, engine/measure/otel.py): export every request's spans."""
    metrics = metrics or Metrics()
    if otlp is None and otlp_endpoint:
        from engine.measure.otel import OtlpExport  # the SDK loads only when asked for

        otlp = OtlpExport(otlp_endpoint)
    traces = RequestTraces(otlp)
    traces.watch(metrics)
    sessions = sessions or Sessions()  # the page mounted on this app issues its tabs' from it too
    backends = {name: metrics.instrument(b, name, engine=str(i))
                for i, (name, b) in enumerate(named_backends(engine_or_backends).items())}
    default_model = next(iter(backends))
    started = now_s()

    app = FastAPI(title="Latency Lab API", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.backends = backends
    app.state.metrics = metrics
    app.state.sessions = sessions
    app.state.traces = traces
    # Every route of the app, the page's included (it mounts here), refuses oversized bodies...
    app.add_middleware(BodySizeLimit, max_bytes=MAX_BODY_BYTES)
    # ...and, with a key, every request without it but /health, /metrics and /login (server/auth.py).
    if api_key is not None:
        app.add_middleware(APIKeyAuth, api_key=api_key, on_refuse=lambda: metrics.api_errors.labels("401").inc())

    def error_response(err: APIError) -> Response:
        metrics.api_errors.labels(str(err.status)).inc()
        # ASCII-escaped: a message quoting bad input (a lone surrogate, say) still renders.
        return Response(json.dumps(err.body()), status_code=err.status, media_type="application/json")

    @app.exception_handler(APIError)
    @app.exception_handler(LatencyLabError)
    async def _api_error(request, exc):
        return error_response(api_error_from(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):  # unknown path, wrong method, a /lab route's own 4xx
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
                429: "queue_full"}.get(exc.status_code)
        detail = exc.detail if isinstance(exc.detail, dict) else {"message": str(exc.detail)}
        err = APIError(exc.status_code, str(detail.get("message") or detail), param=detail.get("param"), code=code)
        if exc.status_code == 429:
            err.type = "rate_limit_error"
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request, exc):  # a typed route's body (the page's /lab): say where, never echo it
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = f"{where + ': ' if where else ''}{first.get('msg', 'invalid request body')}"
        return error_response(APIError(422, message, param=where, code="invalid_value"))

    @app.exception_handler(Exception)
    async def _internal_error(request, exc):  # a bug of ours: still an OpenAI-shaped body
        return error_response(api_error_from(exc))

    def model_card(name: str) -> dict:
        info = backends[name].info()
        return {"id": name, "object": "model", "created": started, "owned_by": "latency-lab",
                "max_model_len": info.context_max, "backend": info.source,
                "latency_lab": info.to_dict()}  # the typed EngineInfo: a remote Latency Lab reads it back

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(name) for name in backends]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        if model_id not in backends:
            raise _unknown_model(model_id, backends)
        return model_card(model_id)

    @app.post("/v1/sessions")
    async def new_session():
        """A session id for `session` in chat requests: its requests share a prefix-cache scope."""
        return {"id": sessions.issue(), "object": "session"}

    @app.get("/v1/queue")
    async def queue():
        """Each local engine's queue now: requests waiting, running, and the bound (--max-queue)."""
        return {"object": "list", "data": [queue_state(name, b) for name, b in backends.items()]}

    @app.get("/health")
    async def health():
        """For load balancers: 200 while every engine can serve, 503 (naming the ones down) otherwise.
        Open without the key, like /metrics (vLLM leaves both open too)."""
        down = [name for name, b in backends.items() if not serving(b)]
        if down:
            return JSONResponse({"status": "unavailable", "down": down}, status_code=503)
        return {"status": "ok", "models": list(backends)}

    @app.get("/metrics")
    async def prometheus_metrics():
        data, content_type = metrics.render()
        return Response(data, media_type=content_type)

    @app.get("/v1/trace/{request_id}")
    async def get_trace(request_id: str):
        """A finished request's trace (Chrome Trace Event JSON: open it in ui.perfetto.dev)."""
        body = traces.trace(request_id)
        if body is None:
            raise APIError(404, f"no finished request {request_id!r} here (the latest {traces.keep} are kept)",
                           param="request_id", code="not_found")
        return body

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        timeline = Timeline()  # glossary: "request received by the server" — before the body is read
        chat = parse_chat_request(await _read_json(request))
        name = chat.model or default_model
        if name not in backends:
            raise _unknown_model(name, backends)
        session = None if chat.session is None else sessions.engine_session(chat.session)
        scoped = {}
        if chat.batch_scope is not None:  # only a local engine has run-scoped batch limits
            if not hasattr(backends[name], "open_batch_scope"):
                raise APIError(400, f"batch_scope applies to a local engine, not to {name!r}", param="batch_scope",
                               code="invalid_value")
            scoped["batch_scope"] = chat.batch_scope
        handle = backends[name].submit(chat.messages, chat.config, session=session, timeline=timeline, **scoped)
        if otlp is not None:
            otlp.parent_from(handle.id, request.headers)  # a caller's traceparent: its trace goes on
        with_trace = request.query_params.get("trace", "").lower() in ("1", "true")
        return await _respond(request, handle, chat, name, with_trace)

    return app


def named_backends(engine_or_backends) -> dict:
    """One engine → {its model name: it}; a dict passes through."""
    if hasattr(engine_or_backends, "submit"):
        return {engine_or_backends.info().name: engine_or_backends}
    backends = dict(engine_or_backends)
    if not backends:
        raise ValueError("create_api needs at least one engine")
    return backends


def serving(backend) -> bool:
    """Whether an engine can take requests: a local worker's thread alive, a remote engine open."""
    worker = getattr(backend, "worker", None)
    thread = getattr(worker, "_thread", None)
    if getattr(worker, "_stopping", False) or thread is not None and not thread.is_alive():
        return False
    return not getattr(backend, "_closed", False)


def queue_state(name: str, backend) -> dict:
    worker = getattr(backend, "worker", None)
    if worker is None:  # a remote engine: its requests in flight from here
        in_flight = backend.in_flight() if hasattr(backend, "in_flight") else None
        return {"model": name, "waiting": None, "running": in_flight, "max_queue": None}
    return {"model": name, "waiting": worker.queue_depth(), "running": worker.running(),
            "max_queue": worker.max_queue}


def _unknown_model(name: str, backends: dict) -> APIError:
    return APIError(404, f"the model {name!r} does not exist here; available: {', '.join(backends)}",
                    param="model", code="model_not_found")


async def _read_json(request: Request):
    size, parts = 0, []
    try:
        async for part in request.stream():
            size += len(part)
            if size > MAX_BODY_BYTES:
                raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES // 1024} KiB",
                               code="request_too_large")
            parts.append(part)
    except ClientDisconnect:  # gone before its body arrived: nobody reads the answer (nginx's 499)
        raise APIError(499, "the client closed the connection before sending its body", code="client_closed")
    try:
        return json.loads(b"".join(parts))
    except (ValueError, RecursionError) as exc:  # ValueError covers bad UTF-8 too
        raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from None


# --- answering ----------------------------------------------------------------------------------
class ClientGone(Exception):
    """The client closed its connection before its reply was ready."""


async def _respond(request: Request, handle, chat, model: str, with_trace: bool = False) -> Response:
    events = handle.aevents()
    try:
        head = await _accepted(request, events)
    except ClientGone:
        handle.cancel()
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"
    except BaseException:
        handle.cancel()
        raise
    if head[-1].kind == "error":
        raise in_api_terms(_exception_of(head[-1]), chat.max_tokens_field)
    cid, created = new_completion_id(), now_s()
    request.app.state.traces.alias(cid, handle.id)
    headers = {"X-Request-Id": handle.id, **queue_headers(handle.timeline)}
    if chat.stream:
        body = _sse_stream(handle, _chain(head, events), chat, model, cid, created, with_trace)
        return _CancelWhenDone(handle, body, media_type="text/event-stream", headers={**STREAM_HEADERS, **headers})
    try:
        rest = await _unless_disconnected(request, _collect(events))
    except ClientGone:
        return Response(status_code=499)
    finally:
        handle.cancel()  # a no-op once done; stops the generation if we got here any other way
    final = (head + rest)[-1]
    if final.kind == "error":
        raise in_api_terms(_exception_of(final), chat.max_tokens_field)
    tl = final.timeline or handle.timeline
    body = completion_body(cid, created, model, final.text, _finish_reason(final), tl)
    if with_trace:
        body["timings"]["trace"] = chrome_trace([tl.to_dict()])
    return JSONResponse(body, headers=headers)


def queue_headers(tl: Timeline) -> dict:
    """Where the request stood in line when it arrived, and how long it waited (`queue_ms`): known
    by the time the reply's headers go, since a reply starts only once the worker has taken it."""
    out = {}
    if tl.queue_position is not None:
        out["X-Queue-Position"] = str(tl.queue_position)
    if tl.queue_ms is not None:
        out["X-Queue-Ms"] = f"{tl.queue_ms:.3f}"
    return out


async def _accepted(request: Request, events) -> list:
    """Events until the engine has accepted the request (tokenized, fits) or ended it."""
    head = []
    while True:
        event = await _unless_disconnected(request, anext(events))
        head.append(event)
        if event.kind != "status" or event.stage not in ("queued", "setup"):
            return head


async def _unless_disconnected(request: Request, awaitable):
    """Await `awaitable`, or raise ClientGone (cancelling it) if the client disconnects first."""
    work = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
    if work.done() and not work.cancelled():
        return work.result()
    raise ClientGone()


async def _disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(events) -> list:
    return [event async for event in events]


async def _chain(head: list, events):
    for event in head:
        yield event
    async for event in events:
        yield event


async def _sse_stream(handle, events, chat, model: str, cid: str, created: int, with_trace: bool = False):
    def chunk(delta, finish_reason=None, **extra) -> str:
        return sse(chunk_body(cid, created, model, delta, finish_reason, **extra))

    yield chunk({"role": "assistant", "content": ""})
    async for event in events:
        if event.kind == "chunk" and event.text:
            yield chunk({"content": event.text})
        elif event.kind == "done":
            tl = event.timeline or handle.timeline
            # like llama.cpp's server: `timings` ride on the chunk that carries finish_reason;
            # like vLLM's: `metrics` ride on the usage chunk (and here on the finish chunk too)
            timings = timings_of(tl)
            if with_trace:  # asked with ?trace=true: the reply's trace rides with its timings
                timings["trace"] = chrome_trace([tl.to_dict()])
            yield chunk({}, _finish_reason(event), timings=timings, metrics=metrics_of(tl))
            if chat.include_usage:
                yield sse(chunk_body(cid, created, model, None, usage=usage_of(tl), metrics=metrics_of(tl)))
        elif event.kind == "error":  # headers are sent: the error goes in the stream, as OpenAI's does
            yield sse(api_error_from(_exception_of(event)).body())
    yield sse("[DONE]")


class _CancelWhenDone(StreamingResponse):
    """A stream that cancels its generation however it ends: finished, client gone, or failed.

    Starlette (ASGI spec < 2.4, as uvicorn runs it) listens for the disconnect while streaming and
    cancels the send loop at once, so a client that leaves frees the worker within one decode step.
    """

    def __init__(self, handle, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handle = handle

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.handle.cancel()


def _exception_of(event) -> Exception:
    return event.detail.get("exception") or LatencyLabError(event.detail.get("message", "the request failed"))


def _finish_reason(event) -> str | None:
    return event.detail.get("finish_reason") or (event.timeline.finish_reason if event.timeline else None)
