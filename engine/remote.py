"""A remote OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, Ollama, another Latency Lab)
as an engine, measured from the client side.

`RemoteEngine` has the `Engine` interface — `submit(messages, config, session=, timeline=)` returns a
handle with `events()` / `aevents()` / `cancel()` / `timeline` / `result()`, and `info()` — so the page,
A/B and the bench use local and remote engines alike.

What its Timeline means (this machine's clock): `received` = submit, `started` = the HTTP request
is sent, `token_ns` = arrival of each streamed chunk that carries text (the client cannot see the
server's tokens, so one chunk counts as one token: most servers send one token per chunk; the
server's own `usage.completion_tokens` is kept in `counters`). `ttft_ms`, `itl_ms`, `e2e_ms` are
therefore client-measured. Whatever timings the server returns land raw in
`counters["server_timings"]` and, mapped onto our glossary by `server_report` (one reader per
server, each naming where its format is documented), in the Timeline's own fields: token counts
(`prompt_tokens`, `cached_tokens`, `prefill_tokens`; None while unknown, never a guessed 0),
speculation counts (`counters["drafted"]`, `["accepted"]`) and the server's intervals on its own
clock (`counters["server_queue_ms"]`, `["server_ttft_ms"]`, `["server_prefill_ms"]`,
`["server_decode_ms"]`, `["server_e2e_ms"]`). Where the server's time to first token from its
receipt is known, `counters["transport_overhead_ms"]` is client ttft − server ttft (network +
HTTP + streaming; vLLM's queue counts on the server's side, not in the overhead).

Ollama: when the base URL is an Ollama server (`GET /api/version` answers when the engine is
made), requests go to its native `POST /api/chat` (NDJSON), which reports `prompt_eval_count` and
`*_duration`; its OpenAI endpoint reports no timings at all. `dialect="openai"` skips the probe
(`--remote-dialect`).

HTTP goes through httpx (async, one connection pool, one event-loop thread per engine) and the
stream through httpx-sse, not the openai SDK: we need the arrival time of each SSE event as the
bytes land, the servers' non-standard fields, and no hidden retries inside a measured request.
Cancelling a handle cancels its task, which closes the connection: the server sees the client go.

Sessions: our session strings (the page's secret tab ids) never leave this machine. For a server
that issues sessions (`POST {base_url}/sessions`: another Latency Lab, which accepts only ids it
issued) each of our sessions is mapped to one it issued, asked for on the session's first
request; a server without that endpoint is sent no session.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import replace

import httpx
from httpx_sse import EventSource

from .config import TOGGLES, GenerationConfig
from .errors import InvalidRequest, LatencyLabError
from .info import EngineInfo
from .timeline import Timeline, now_ns
from .wire import Event, Request, RequestHandle, validate_messages

log = logging.getLogger(__name__)
_ids = itertools.count(1)
# The toggles another Latency Lab honours: derived from their one declaration (engine/config.py).
FORWARDED = tuple(t.name for t in TOGGLES if "remote-lab" in t.backends)
DIALECTS = ("auto", "openai", "ollama")  # auto: ask the server once, when the engine is made
MAX_REMOTE_SESSIONS = 1024  # our session → the server's id, least recently used forgotten first


class RemoteError(LatencyLabError):
    """The remote server refused or failed a request; its HTTP status and error fields are kept."""

    def __init__(self, message: str, status: int = 502, error_type: str = "server_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.error_type, self.param, self.code = status, error_type, param, code


class RemoteHandle(RequestHandle):
    future = None  # the request's task on the engine's event loop

    def cancel(self) -> None:
        super().cancel()
        if self.future is not None:
            self.future.cancel()  # cancels the task: the connection closes, the server stops


class RemoteEngine:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 600.0,
                 send_toggles: bool = True, dialect: str = "auto"):
        """`base_url` is the API root as the openai SDK takes it, e.g. `http://host:8000/v1`.
        `send_toggles`: send our toggles (kv_reuse, speculative...) when they differ from the defaults;
        servers that do not know them ignore them (vLLM, llama.cpp) — turn off for strict servers.
        `dialect`: auto (probe once for Ollama's native API), openai, or ollama."""
        if dialect not in DIALECTS:
            raise InvalidRequest(f"dialect must be one of {', '.join(DIALECTS)}, not {dialect!r}", "dialect")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.send_toggles = send_toggles
        self.dialect = dialect
        self.completed = self.failed = 0
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout, connect=10.0)
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
        return httpx.AsyncClient(timeout=self._timeout, headers=self._headers)

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- the Engine interface ----------------------------------------------------------------
    tokenizer = None  # the server tokenizes; we never see token ids

    def submit(self, messages: list[dict] | None = None, config: GenerationConfig | None = None, *,
               prompt_ids: list[int] | None = None, session: str | None = None,
               timeline: Timeline | None = None) -> RemoteHandle:
        config = (config or GenerationConfig()).validate()
        if prompt_ids is not None:
            raise InvalidRequest("a remote engine takes chat messages, not token ids", "prompt_ids")
        if self._closed:
            raise LatencyLabError("the remote engine is closed")
        request = Request(messages=messages, config=config, session=session, id=f"remote-{next(_ids)}")
        timeline = timeline or Timeline()
        timeline.request_id = request.id
        timeline.queue_position = 0
        timeline.prompt_tokens = timeline.cached_tokens = timeline.prefill_tokens = None  # until the server says
        timeline.counters["measured_at"] = "client"
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
        try:
            if handle.cancelled:
                raise asyncio.CancelledError
            ollama = self.dialect == "ollama"
            messages = validate_messages(req.messages)
            if ollama:
                url, body = f"{_root(self.base_url)}/api/chat", ollama_body(self.model, messages, req.config)
                headers, read = {}, self._read_ollama
            else:
                session = await self._remote_session(req.session)
                url = f"{self.base_url}/chat/completions"
                body = request_body(self.model, messages, req.config, session, self.send_toggles)
                headers, read = {"Accept": "text/event-stream"}, self._read_sse
            tl.mark("started")
            handle.push(Event("status", stage="setup"))
            async with self._client.stream("POST", url, json=body, headers=headers) as resp:
                tl.counters["response_headers_ms"] = (now_ns() - tl.received_ns) / 1e6
                if resp.status_code != 200:
                    raise remote_error(resp.status_code, await resp.aread())
                _absorb(tl, tgi_headers(resp.headers))
                handle.push(Event("status", stage="prefill"))  # accepted: the server works on token one
                async for t, piece, reason in read(tl, resp):
                    finish = reason or finish
                    if piece:
                        tl.add_tokens(1, t)
                        parts.append(piece)
                        handle.push(Event("chunk", text=piece, output_tokens=len(parts)))
            tl.finish_reason = finish or "stop"
            tl.counters["chunks"] = len(parts)
            _server_ttft(tl)
            tl.mark("done")
            self.completed += 1
            handle.push(Event("done", text="".join(parts), output_tokens=len(parts),
                              detail={"finish_reason": tl.finish_reason}, timeline=tl))
        except asyncio.CancelledError:
            tl.finish_reason = "cancelled"
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

    async def _read_sse(self, tl: Timeline, resp):
        async for sse in EventSource(resp).aiter_sse():
            t = now_ns()
            if sse.data.strip() == "[DONE]":
                return
            piece, reason = self._read_chunk(tl, sse.data)
            yield t, piece, reason

    async def _read_ollama(self, tl: Timeline, resp):
        """Ollama's native stream: one JSON object a line; the last (`done: true`) carries the figures."""
        async for line in resp.aiter_lines():
            t = now_ns()
            if not line.strip():
                continue
            payload = _json_object(line, "line")
            message = payload.get("message") or {}
            piece = message.get("content") if isinstance(message.get("content"), str) else ""
            reason = None
            if payload.get("done"):
                raw = {k: v for k, v in payload.items() if k.endswith(("_count", "_duration"))}
                tl.counters.setdefault("server_timings", {}).update(raw)
                _absorb(tl, ollama_report(payload))
                reason = {"stop": "stop", "length": "length"}.get(payload.get("done_reason"), "stop")
            yield t, piece, reason

    async def _remote_session(self, ours: str | None) -> str | None:
        """The server's session id standing for our session `ours` (None: send none)."""
        if not ours or not self.send_toggles or not self._server_has_sessions:
            return None
        if ours in self._remote_sessions:
            self._remote_sessions.move_to_end(ours)
            return self._remote_sessions[ours]
        resp = await self._client.post(f"{self.base_url}/sessions")
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
    def _read_chunk(tl: Timeline, data: str) -> tuple[str, str | None]:
        """One SSE payload: its text and finish_reason; usage and server timings go on the Timeline."""
        payload = _json_object(data, "chunk")
        timings = server_timings(payload)
        if timings:
            tl.counters.setdefault("server_timings", {}).update(timings)
        if isinstance(payload.get("usage"), dict):
            _apply_usage(tl, payload["usage"])
        _absorb(tl, server_report(payload))
        text, finish = "", None
        for choice in payload.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                text += delta["content"]
            finish = choice.get("finish_reason") or finish
        return text, finish


def request_body(model: str, messages: list[dict], cfg: GenerationConfig, session: str | None,
                 send_toggles: bool) -> dict:
    body = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p}
    if cfg.seed is not None:
        body["seed"] = cfg.seed
    if cfg.stop:
        body["stop"] = list(cfg.stop)
    if cfg.top_k:
        body["top_k"] = cfg.top_k  # vLLM, SGLang and llama.cpp take it; OpenAI itself does not
    if send_toggles:
        default = GenerationConfig()
        body.update({name: getattr(cfg, name) for name in FORWARDED if getattr(cfg, name) != getattr(default, name)})
        if session:
            body["session"] = session
    return body


def ollama_body(model: str, messages: list[dict], cfg: GenerationConfig) -> dict:
    """Ollama's native /api/chat request (docs/api.md in ollama/ollama: "Generate a chat completion")."""
    options = {"num_predict": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p}
    if cfg.top_k:
        options["top_k"] = cfg.top_k
    if cfg.seed is not None:
        options["seed"] = cfg.seed
    if cfg.stop:
        options["stop"] = list(cfg.stop)
    return {"model": model, "messages": messages, "stream": True, "options": options}


def _root(base_url: str) -> str:
    """The server's root: the OpenAI-style base URL without its /v1."""
    return base_url[:-3] if base_url.endswith("/v1") else base_url


def _json_object(text: str, what: str) -> dict:
    """One streamed JSON object (an SSE chunk, an Ollama line); a server's error object raises."""
    try:
        payload = json.loads(text)
    except ValueError:
        raise RemoteError(f"the server sent a {what} that is not JSON: {text[:200]!r}") from None
    if not isinstance(payload, dict):
        raise RemoteError(f"the server sent an unexpected {what}: {text[:200]!r}")
    if payload.get("error") is not None:
        raise remote_error(502, payload)
    return payload


def server_timings(payload: dict) -> dict:
    """Timing fields a server put in a chunk or body, raw (ours and llama.cpp: `timings`; vLLM: `metrics`)."""
    found = {}
    for key in ("timings", "metrics"):
        if isinstance(payload.get(key), dict):
            found.update(payload[key])
    return found


# --- each server's report, mapped onto our glossary (the server's own clock) ---------------------
# Keys: queue_ms, ttft_ms (from the server's receipt), ttft_source, prefill_ms, decode_ms, e2e_ms,
# prompt_tokens, cached_tokens, prefill_tokens, output_tokens, drafted, accepted. A key is present
# only when the server reported it; nothing is guessed.

def server_report(payload: dict) -> dict:
    """What one OpenAI-style chunk or body reports, whichever server sent it."""
    timings = payload.get("timings") if isinstance(payload.get("timings"), dict) else {}
    if "e2e_ms" in timings and "ttft_ms" in timings:  # another Latency Lab (it also speaks llama.cpp's names)
        return latency_lab_report(timings)
    report = llama_cpp_report(timings) if timings else {}
    if isinstance(payload.get("metrics"), dict):
        report.update(vllm_report(payload["metrics"]))
    return report


def latency_lab_report(t: dict) -> dict:
    """Our own `timings` (docs/api.md): glossary names already."""
    names = ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "prompt_tokens", "cached_tokens",
             "prefill_tokens", "output_tokens", "drafted", "accepted")
    report = {k: t[k] for k in names if _num(t.get(k))}
    if "ttft_ms" in report:
        report["ttft_source"] = "ttft_ms"
    return {**report, "dialect": "latency-lab"}


def llama_cpp_report(t: dict) -> dict:
    """llama.cpp server's `timings` (tools/server/README.md in ggml-org/llama.cpp): prompt_n tokens
    prefilled in prompt_ms (up to the first token), predicted_n generated in predicted_ms, cache_n
    reused from the KV cache, draft_n / draft_n_accepted for speculative decoding. It reports no
    queue time, so its TTFT from receipt is unknown: prompt_ms stands in as a lower bound."""
    report = {}
    for ours, theirs in (("prefill_tokens", "prompt_n"), ("prefill_ms", "prompt_ms"), ("output_tokens", "predicted_n"),
                         ("decode_ms", "predicted_ms"), ("cached_tokens", "cache_n"), ("drafted", "draft_n"),
                         ("accepted", "draft_n_accepted")):
        if _num(t.get(theirs)):
            report[ours] = t[theirs]
    if "prefill_tokens" in report and "cached_tokens" in report:
        report["prompt_tokens"] = report["prefill_tokens"] + report["cached_tokens"]
    if "prefill_ms" in report:
        report["ttft_ms"], report["ttft_source"] = report["prefill_ms"], "prompt_ms"
    return {**report, "dialect": "llama.cpp"} if report else report


def vllm_report(m: dict) -> dict:
    """vLLM's per-request `metrics` (docs/features/per_request_metrics.md in vllm-project/vllm, with
    `--enable-per-request-metrics`): time_to_first_token_ms counts from *scheduling*, queue_time_ms
    apart, generation_time_ms is first → last token. Its TTFT from receipt is their sum."""
    report = {}
    if _num(m.get("queue_time_ms")):
        report["queue_ms"] = m["queue_time_ms"]
    if _num(m.get("generation_time_ms")):
        report["decode_ms"] = m["generation_time_ms"]
    ttft = m.get("time_to_first_token_ms")
    if _num(ttft):
        if "queue_ms" in report:
            report["ttft_ms"], report["ttft_source"] = report["queue_ms"] + ttft, "queue_time_ms+time_to_first_token_ms"
        else:  # queue unknown: a lower bound
            report["ttft_ms"], report["ttft_source"] = ttft, "time_to_first_token_ms"
    return {**report, "dialect": "vllm"} if report else report


def ollama_report(p: dict) -> dict:
    """Ollama's native final object (docs/api.md in ollama/ollama): durations in ns; prompt_eval_count
    counts the prompt tokens evaluated (a cached prefix is not evaluated, and not reported apart).
    Its TTFT is not reported: load_duration + prompt_eval_duration stands in as a lower bound."""
    ms = {k: p[k] / 1e6 for k in ("load_duration", "prompt_eval_duration", "eval_duration", "total_duration")
          if _num(p.get(k))}
    report = {}
    if _num(p.get("prompt_eval_count")):
        report["prefill_tokens"] = p["prompt_eval_count"]
    if _num(p.get("eval_count")):
        report["output_tokens"] = p["eval_count"]
    if "prompt_eval_duration" in ms:
        report["prefill_ms"] = ms["prompt_eval_duration"]
        report["ttft_ms"] = ms["prompt_eval_duration"] + ms.get("load_duration", 0.0)
        report["ttft_source"] = "load_duration+prompt_eval_duration"
    if "eval_duration" in ms:
        report["decode_ms"] = ms["eval_duration"]
    if "total_duration" in ms:
        report["e2e_ms"] = ms["total_duration"]
    return {**report, "dialect": "ollama"} if report else report


def tgi_headers(headers) -> dict:
    """TGI's timing headers (router/src/server.rs in huggingface/text-generation-inference: x-queue-time,
    x-inference-time, x-prompt-tokens, x-generated-tokens, in ms). TGI sets them on non-streamed
    answers; a streamed chat carries only `usage`, so for it these stay unknown."""
    report = {}
    for ours, name in (("queue_ms", "x-queue-time"), ("inference_ms", "x-inference-time"),
                       ("prompt_tokens", "x-prompt-tokens"), ("output_tokens", "x-generated-tokens")):
        raw = headers.get(name)
        if raw is not None:
            try:
                report[ours] = int(raw) if ours.endswith("tokens") else float(raw)
            except ValueError:
                pass
    return {**report, "dialect": "tgi"} if report else report


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _absorb(tl: Timeline, report: dict) -> None:
    """A server's report onto the Timeline: token counts where still unknown, the rest in counters.
    Another Latency Lab's own figures win over its vLLM-style `metrics` (which say less)."""
    c = tl.counters
    if not report or c.get("server_dialect") == "latency-lab" and report.get("dialect") != "latency-lab":
        return
    c["server_dialect"] = report.get("dialect")
    for name in ("prompt_tokens", "cached_tokens", "prefill_tokens"):
        if name in report and getattr(tl, name) is None:
            setattr(tl, name, report[name])
    if tl.prefill_tokens is None and tl.prompt_tokens is not None and tl.cached_tokens is not None:
        tl.prefill_tokens = max(tl.prompt_tokens - tl.cached_tokens, 0)
    for name in ("drafted", "accepted"):
        if name in report:
            c[name] = report[name]
    if report.get("drafted"):
        c["acceptance_rate"] = round(report.get("accepted", 0) / report["drafted"], 4)
    for name in ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "inference_ms", "output_tokens"):
        if name in report:
            c[f"server_{name}"] = report[name]
    if "ttft_source" in report:
        c["server_ttft_source"] = report["ttft_source"]


def _apply_usage(tl: Timeline, usage: dict) -> None:
    """OpenAI `usage`. A server that omits prompt_tokens_details (SGLang without --enable-cache-report,
    llama-cpp-python) leaves cached_tokens unknown (None), not 0."""
    prompt = usage.get("prompt_tokens")
    if _num(prompt) and prompt > 0:  # no chat prompt has 0 tokens: a 0 means the server did not count
        tl.prompt_tokens = int(prompt)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if _num(cached):
        tl.cached_tokens = int(cached)
    if tl.prompt_tokens is not None and tl.cached_tokens is not None:
        tl.prefill_tokens = max(tl.prompt_tokens - tl.cached_tokens, 0)
    if _num(usage.get("completion_tokens")):
        tl.counters["completion_tokens"] = usage["completion_tokens"]


def _server_ttft(tl: Timeline) -> None:
    """The overhead between the server's first token and ours: client ttft − server ttft (from its receipt)."""
    server = tl.counters.get("server_ttft_ms")
    if _num(server) and tl.ttft_ms is not None:
        tl.counters["transport_overhead_ms"] = tl.ttft_ms - float(server)


def remote_error(status: int, raw) -> RemoteError:
    """An error answer (bytes or a parsed payload) → RemoteError with the server's own fields."""
    payload = raw
    if isinstance(raw, (bytes, str)):
        try:
            payload = json.loads(raw)
        except ValueError:
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            return RemoteError(f"the remote server answered {status}: {text.strip()[:300]}", status)
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, str):  # some servers send {"error": "message"}
        err = {"message": err}
    if not isinstance(err, dict):
        err = {"message": json.dumps(payload)[:300]}
    return RemoteError(f"the remote server answered {status}: {err.get('message') or 'no message'}", status,
                       err.get("type") or ("invalid_request_error" if status < 500 else "server_error"),
                       err.get("param"), err.get("code"))

