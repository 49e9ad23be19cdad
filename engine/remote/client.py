"""A remote OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, Ollama, another Latency Lab)
as an engine, measured from the client side.

`RemoteEngine` has the `Engine` interface — `submit(messages, config, session=, timeline=)` returns a
handle with `events()` / `aevents()` / `cancel()` / `timeline` / `result()`, and `info()` — so the page,
A/B and the bench use local and remote engines alike.

What its Timeline means (this machine's clock): `received` = submit, `started` = the HTTP request
is sent, `token_ns` = arrival of each streamed chunk that carries text (the client cannot see the
server's tokens, so one chunk counts as one token: most servers send one token per chunk; the
server's own `usage.completion_tokens` is kept in `counters.remote`). `ttft_ms`, `itl_ms`, `e2e_ms` are
therefore client-measured. Whatever timings the server returns land raw in
`counters.remote.server_timings` and, mapped onto our glossary by `server_report` (one reader per
server, each naming where its format is documented: engine/remote/dialects.py), in the Timeline's
own fields: token counts (`prompt_tokens`, `cached_tokens`, `prefill_tokens`; None while unknown,
never a guessed 0),
speculation counts (`counters.speculation.drafted`, `.accepted`) and the server's intervals on its own
clock (`counters.remote.server_queue_ms`, `.server_ttft_ms`, `.server_prefill_ms`,
`.server_decode_ms`, `.server_e2e_ms`). Where the server's time to first token from its
receipt is known, `counters.remote.transport_overhead_ms` is client ttft − server ttft (network +
HTTP + streaming; vLLM's queue counts on the server's side, not in the overhead).

Ollama: when the base URL is an Ollama server (`GET /api/version` answers when the engine is
made), requests go to its native `POST /api/chat` (NDJSON), which reports `prompt_eval_count` and
`*_duration`; its OpenAI endpoint reports no timings at all. `dialect="openai"` skips the probe
(`--remote-dialect`).

HTTP goes through httpx (async, one connection pool, one event-loop thread per engine) and the
stream through httpx-sse, not the openai SDK: we need the arrival time of each SSE event as the
bytes land, the servers' non-standard fields, and no hidden retries inside a measured request.
Every request's network phases (DNS, connect, TLS, request sent, response headers; a reused
connection has none of the first three) are timed through httpcore's trace hooks
(engine/remote/network.py) and land in the Timeline's spans and `counters.network`.
Cancelling a handle cancels its task, which closes the connection: the server sees the client go.

Sessions: our session strings (the page's secret tab ids) never leave this machine. For a server
that issues sessions (`POST {base_url}/sessions`: another Latency Lab, which accepts only ids it
issued) each of our sessions is mapped to one it issued, asked for on the session's first
request; a server without that endpoint is sent no session.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import threading
from collections import OrderedDict
from dataclasses import replace

import httpx
from httpx_sse import EventSource

from engine.core.config import GenerationConfig
from engine.core.counters import RemoteCounters
from engine.core.errors import InvalidRequest, LatencyLabError
from engine.core.info import EngineInfo
from engine.core.request import Event, Request, RequestHandle
from engine.core.thinking import ReasoningText
from engine.core.timeline import Timeline, now_ns
from engine.remote import network
from engine.remote.dialects import (
    absorb,
    apply_usage,
    ollama_report,
    remote_counters,
    server_report,
    server_timings,
    server_ttft,
    tgi_headers,
)
from engine.remote.wire import (
    FORWARDED,
    RemoteError,
    json_object,
    ollama_body,
    remote_error,
    request_body,
)

log = logging.getLogger(__name__)
_ids = itertools.count(1)
DIALECTS = ("auto", "openai", "ollama")  # auto: ask the server once, when the engine is made
MAX_REMOTE_SESSIONS = 1024  # our session → the server's id, least recently used forgotten first


class RemoteHandle(RequestHandle):
    future = None  # the request's task on the engine's event loop

    def cancel(self) -> None:
        super().cancel()
        if self.future is not None:
            self.future.cancel()  # cancels the task: the connection closes, the server stops


class RemoteEngine:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                 send_toggles: bool = True, dialect: str = "auto", verify: bool | ssl.SSLContext = True):
        """`base_url` is the API root as the openai SDK takes it, e.g. `http://host:8000/v1`.
        `send_toggles`: send our toggles (kv_reuse, speculative...) when they differ from the defaults;
        servers that do not know them ignore them (vLLM, llama.cpp) — turn off for strict servers.
        `dialect`: auto (probe once for Ollama's native API), openai, or ollama. `verify`: httpx's
        (an SSLContext trusting a private CA, or False)."""
        if dialect not in DIALECTS:
            raise InvalidRequest(f"dialect must be one of {', '.join(DIALECTS)}, not {dialect!r}", "dialect")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.send_toggles = send_toggles
        self.dialect = dialect
        self.completed = self.failed = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout, connect=10.0)
        self._verify = verify
        self._active: set[RemoteHandle] = set()
        self._remote_sessions: OrderedDict[str, str] = OrderedDict()
        self._server_has_sessions = True  # until a POST /sessions says otherwise
        self._closed = False
        self._info: EngineInfo | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"remote-{model}", daemon=True)
        self._thread.start()
        self._client = self._call(self._new_client())
        if self.dialect == "auto":  # probed here, so no request's measured time holds the probe
            self.dialect = self._call(self._probe(), timeout=15.0)

    async def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout, headers=self._headers,
                                 transport=network.transport(verify=self._verify))

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- the Engine interface ----------------------------------------------------------------
    tokenizer = None  # the server tokenizes; we never see token ids

    def submit(self, messages: list[dict] | None = None, config: GenerationConfig | None = None, *,
               prompt_ids: list[int] | None = None, session: str | None = None,
               timeline: Timeline | None = None) -> RemoteHandle:
        config = config or GenerationConfig()
        if prompt_ids is not None:
            raise InvalidRequest("a remote engine takes chat messages, not token ids", "prompt_ids")
        if self._closed:
            raise LatencyLabError("the remote engine is closed")
        request = Request(messages=messages, config=config, session=session, id=f"remote-{next(_ids)}")
        timeline = timeline or Timeline()
        timeline.request_id = request.id
        timeline.queue_position = 0
        timeline.prompt_tokens = timeline.cached_tokens = timeline.prefill_tokens = None  # until the server says
        timeline.counters.remote = RemoteCounters()  # measured_at "client": what the server says fills it
        handle = RemoteHandle(request, timeline)
        timeline.mark("enqueued")
        handle.push(Event("status", stage="queued", detail={"position": 0}))
        handle.future = asyncio.run_coroutine_threadsafe(self._run(handle), self._loop)
        return handle

    def complete(self, messages: list[dict], config: GenerationConfig | None = None, **kw) -> Event:
        return self.submit(messages, config, **kw).result()

    def info(self) -> EngineInfo:
        """What the server says of itself: a Latency Lab sends its whole EngineInfo in its model card
        (`latency_lab`); any other server only what its card has. Asked once; unknowns stay None."""
        if self._info is None:
            card = {}
            try:
                card = self._call(self._model_card(), timeout=5.0)
            except Exception as exc:  # a server that is down must not take the page with it
                log.warning("remote %s: no model card (%s)", self.base_url, exc)
            note = f"a remote server at {self.base_url}, measured from this machine"
            lab = card.get("latency_lab") if isinstance(card, dict) else None
            if isinstance(lab, dict):
                remote = EngineInfo.from_dict(lab)
                self._info = replace(remote, name=self.model, source="remote", path=self.base_url,
                                     notes=(note, *remote.notes),
                                     extra={**remote.extra, "remote_source": remote.source, "dialect": self.dialect})
            else:
                max_len = card.get("max_model_len") if isinstance(card, dict) else None
                self._info = EngineInfo(name=self.model, source="remote", path=self.base_url, device="remote",
                                        context_max=max_len if isinstance(max_len, int) else None,
                                        toggles=FORWARDED if self.send_toggles else (), notes=(note,),
                                        extra={"dialect": self.dialect})
        return self._info

    async def _model_card(self) -> dict:
        response = await self._client.get(f"{self.base_url}/models/{self.model}", timeout=3.0)
        response.raise_for_status()
        return response.json()

    def in_flight(self) -> int:
        return len(self._active)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for handle in list(self._active):
            handle.cancel()
        try:
            self._call(self._client.aclose(), timeout=5.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            if not self._thread.is_alive():
                self._loop.close()

    # --- one request, on the engine's event loop ----------------------------------------------
    async def _run(self, handle: RemoteHandle) -> None:
        tl, req = handle.timeline, handle.request
        parts: list[str] = []
        finish = None
        self._active.add(handle)
        url = self.base_url
        phases = network.Phases(tl)
        phases.recording()
        try:
            if handle.cancelled:
                raise asyncio.CancelledError
            ollama = self.dialect == "ollama"
            messages = req.messages  # checked when the Request was made
            if ollama:
                url, body = f"{_root(self.base_url)}/api/chat", ollama_body(self.model, messages, req.config)
                headers, read = {}, self._read_ollama
            else:
                session = await self._remote_session(req.session, phases)
                url = f"{self.base_url}/chat/completions"
                body = request_body(self.model, messages, req.config, session, self.send_toggles)
                headers, read = {"Accept": "text/event-stream"}, self._read_sse
            tl.mark("started")
            handle.push(Event("status", stage="setup"))
            async with self._client.stream("POST", url, json=body, headers=headers,
                                           extensions=phases.extensions("chat")) as resp:
                remote_counters(tl).response_headers_ms = (now_ns() - tl.received_ns) / 1e6
                if resp.status_code != 200:
                    raise remote_error(resp.status_code, await resp.aread())
                absorb(tl, tgi_headers(resp.headers))
                handle.push(Event("status", stage="prefill"))  # accepted: the server works on token one
                async for t, piece, reason in read(tl, resp, ReasoningText()):
                    finish = reason or finish
                    if piece:
                        tl.add_tokens(1, t)
                        parts.append(piece)
                        handle.push(Event("chunk", text=piece, output_tokens=len(parts)))
            tl.finish_reason = finish or "stop"
            remote_counters(tl).chunks = len(parts)
            server_ttft(tl)
            phases.finish()  # before the done/error event: whoever it wakes reads the whole Timeline
            tl.mark("done")
            self.completed += 1
            handle.push(Event("done", text="".join(parts), output_tokens=len(parts),
                              detail={"finish_reason": tl.finish_reason}, timeline=tl))
        except asyncio.CancelledError:
            tl.finish_reason = "cancelled"
            phases.finish()
            tl.mark("done")
            handle.push(Event("done", text="".join(parts), output_tokens=len(parts),
                              detail={"finish_reason": "cancelled"}, timeline=tl))
        except Exception as exc:  # the request fails alone; the engine keeps serving
            self.failed += 1
            user_error = isinstance(exc, LatencyLabError)
            if isinstance(exc, httpx.HTTPError):
                exc, user_error = RemoteError(f"could not talk to {url}: {type(exc).__name__}: {exc}"), True
            elif not user_error:
                log.exception("remote request %s failed", handle.id)
            tl.finish_reason = "error"
            phases.finish()
            tl.mark("done")
            handle.push(Event("error", timeline=tl, detail={
                "message": str(exc) if user_error else f"internal error: {type(exc).__name__}: {exc}",
                "type": type(exc).__name__, "param": getattr(exc, "param", None),
                "user_error": user_error, "exception": exc}))
        finally:
            self._active.discard(handle)

    async def _probe(self) -> str:
        """"ollama" when the server answers Ollama's own `GET /api/version`, else "openai"."""
        try:
            resp = await self._client.get(f"{_root(self.base_url)}/api/version", timeout=5.0)
            found = resp.status_code == 200 and isinstance(resp.json().get("version"), str)
        except (httpx.HTTPError, ValueError, AttributeError):
            found = False
        return "ollama" if found else "openai"

    async def _read_sse(self, tl: Timeline, resp, marked: ReasoningText):
        ended = False
        async for sse in EventSource(resp).aiter_sse():
            if ended:  # past [DONE]: read the body to its end, so that the connection is kept alive
                continue  # (a response left unread closes it: every request would pay connect and TLS)
            t = now_ns()
            if sse.data.strip() == "[DONE]":
                ended = True
                continue
            piece, reason = self._read_chunk(tl, sse.data, marked)
            yield t, piece, reason

    async def _read_ollama(self, tl: Timeline, resp, marked: ReasoningText):
        """Ollama's native stream: one JSON object a line; the last (`done: true`) carries the figures.
        A thinking model's thought comes apart in `message.thinking` (docs/api.md in ollama/ollama)."""
        async for line in resp.aiter_lines():
            t = now_ns()
            if not line.strip():
                continue
            payload = json_object(line, "line")
            message = payload.get("message") or {}
            piece = marked.piece(_reasoning(tl, message, ("thinking",)), _text(message.get("content")))
            reason = None
            if payload.get("done"):
                raw = {k: v for k, v in payload.items() if k.endswith(("_count", "_duration"))}
                _keep_timings(tl, raw)
                absorb(tl, ollama_report(payload))
                reason = {"stop": "stop", "length": "length"}.get(payload.get("done_reason"), "stop")
            yield t, piece, reason

    async def _remote_session(self, ours: str | None, phases: network.Phases) -> str | None:
        """The server's session id standing for our session `ours` (None: send none)."""
        if not ours or not self.send_toggles or not self._server_has_sessions:
            return None
        if ours in self._remote_sessions:
            self._remote_sessions.move_to_end(ours)
            return self._remote_sessions[ours]
        resp = await self._client.post(f"{self.base_url}/sessions", extensions=phases.extensions("session"))
        try:
            issued = resp.json().get("id") if resp.status_code == 200 else None
        except (ValueError, AttributeError):
            issued = None
        if not isinstance(issued, str):
            if resp.status_code in (404, 405):
                self._server_has_sessions = False  # vLLM, llama.cpp...: no sessions there
            return None
        self._remote_sessions[ours] = issued
        while len(self._remote_sessions) > MAX_REMOTE_SESSIONS:
            self._remote_sessions.popitem(last=False)
        return issued

    @staticmethod
    def _read_chunk(tl: Timeline, data: str, marked: ReasoningText) -> tuple[str, str | None]:
        """One SSE payload: its text and finish_reason; usage and server timings go on the Timeline.
        A reasoning delta (llama.cpp's `reasoning_content`, vLLM's `reasoning`, formerly
        `reasoning_content`) is kept in the text as a marked thought (engine/core/thinking.py)."""
        payload = json_object(data, "chunk")
        timings = server_timings(payload)
        if timings:
            _keep_timings(tl, timings)
        if isinstance(payload.get("usage"), dict):
            apply_usage(tl, payload["usage"])
        absorb(tl, server_report(payload))
        text, finish = "", None
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            text += marked.piece(_reasoning(tl, delta, REASONING_FIELDS), _text(delta.get("content")))
            finish = choice.get("finish_reason") or finish
        return text, finish


REASONING_FIELDS = ("reasoning_content", "reasoning")  # one of them, never both added: vLLM 0.11 may send both


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _reasoning(tl: Timeline, delta: dict, fields: tuple[str, ...]) -> str:
    """A delta's reasoning text, from the first of `fields` that holds some; the field is noted once."""
    for name in fields:
        if isinstance(delta.get(name), str) and delta[name]:
            if tl.counters.thought_source is None:
                tl.counters.thought_source = name
            return delta[name]
    return ""


def _keep_timings(tl: Timeline, raw: dict) -> None:
    r = remote_counters(tl)
    r.server_timings = {**(r.server_timings or {}), **raw}


def _root(base_url: str) -> str:
    """The server's root: the OpenAI-style base URL without its /v1."""
    return base_url[:-3] if base_url.endswith("/v1") else base_url
