"""The OpenAI chat-completions wire format: read a request body, write replies, chunks and errors.

Plain functions over dicts, no HTTP. Values are checked by `GenerationConfig.validate`, so the
API, the CLI and the page refuse the same things with the same words; this module only maps the
OpenAI field names onto ours and refuses what the engine cannot do (n > 1, tools, logprobs...).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass

from engine.core.config import TOGGLES as CONFIG_TOGGLES
from engine.core.config import GenerationConfig
from engine.core.errors import ContextOverflow, InvalidRequest, LatencyLabError
from engine.core.request import validate_messages
from engine.core.timeline import Timeline

MAX_SESSION_CHARS = 200
# Our optimization toggles, accepted as extra body fields (the openai SDK sends them via extra_body);
# derived from their one declaration (engine/core/config.py).
TOGGLES = tuple(t.name for t in CONFIG_TOGGLES if "local" in t.backends)
# Fields we read; any other field is refused with a 400 that names it, except these standard
# OpenAI fields, which are accepted and ignored (they change nothing a local engine does).
READ = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
        "top_p", "top_k", "seed", "stop", "n", "response_format", "session", "batch_scope"}
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort",
           "safety_identifier", "prompt_cache_key", "verbosity", "web_search_options"}
# Standard fields we cannot honour: refused when set to anything but their "off" value.
UNSUPPORTED = {
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none"),
    "function_call": (None, "none"),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}


@dataclass
class ChatRequest:
    """One parsed /v1/chat/completions body."""

    model: str | None
    messages: list[dict]
    config: GenerationConfig
    stream: bool
    include_usage: bool
    session: str | None
    max_tokens_field: str  # the name the client used, so errors point at its own field
    batch_scope: str | None = None  # a load run's batch limit (engine Worker.open_batch_scope), opened in-process


def parse_chat_request(body) -> ChatRequest:
    """Map an OpenAI request body onto a GenerationConfig; raise InvalidRequest(param=...) on bad input."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object", None)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be a string", "model")
    unknown = sorted(set(body) - READ - IGNORED - set(UNSUPPORTED) - set(TOGGLES))
    if unknown:
        name = unknown[0]
        plain = name.isascii() and name.isprintable() and len(name) <= 64
        raise InvalidRequest(f"unknown field {name!r}: " if plain else "a field name that is not plain text: "
                             f"this server reads the OpenAI chat fields and its toggles ({', '.join(TOGGLES)})",
                             name if plain else None)  # never echo what is not plain text
    messages = validate_messages(_messages(body.get("messages")))
    for name, allowed in UNSUPPORTED.items():
        if body.get(name) not in allowed:
            raise InvalidRequest(f"{name} is not supported by this server", name)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise InvalidRequest("only n=1 is supported", "n")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise InvalidRequest("only response_format {\"type\": \"text\"} is supported", "response_format")
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object", "stream_options")
    include_usage = _bool(options or {}, "include_usage", False, param="stream_options.include_usage")
    session = body.get("session")
    if session is not None and (not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION_CHARS):
        raise InvalidRequest(f"session must be a string of 1 to {MAX_SESSION_CHARS} characters", "session")
    batch_scope = body.get("batch_scope")
    if batch_scope is not None and (not isinstance(batch_scope, str) or not 0 < len(batch_scope) <= 64):
        raise InvalidRequest("batch_scope must be a string of 1 to 64 characters", "batch_scope")

    # max_completion_tokens is the current name; max_tokens the older one that most servers take.
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    changes = {"max_new_tokens": body.get(field), "temperature": body.get("temperature"),
               "top_p": body.get("top_p"), "top_k": body.get("top_k"), "seed": body.get("seed"),
               "stop": _stop(body.get("stop"))}
    changes.update({name: body.get(name) for name in TOGGLES})
    config = GenerationConfig(**{k: v for k, v in changes.items() if v is not None})
    try:
        config.validate()
    except InvalidRequest as exc:
        raise in_api_terms(exc, field) from None
    return ChatRequest(model, messages, config, stream, include_usage, session, field, batch_scope)


def _messages(raw) -> list:
    """OpenAI messages → engine messages: text content parts joined; `developer` is a system message."""
    if not isinstance(raw, list):
        return raw  # validate_messages says what is wrong
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            out.append(m)
            continue
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise InvalidRequest(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        role = "system" if m.get("role") == "developer" else m.get("role")
        out.append({"role": role, "content": content})
    return out


def _stop(raw):
    if raw is None:
        return None
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list):
        return tuple(raw)  # validate() checks the items
    raise InvalidRequest("stop must be a string or a list of strings", "stop")


def _bool(obj: dict, name: str, default: bool, param: str | None = None) -> bool:
    value = obj.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false", param or name)
    return value


def in_api_terms(exc: Exception, max_tokens_field: str) -> Exception:
    """Point an engine error at the API's field name (max_new_tokens is ours, not OpenAI's)."""
    if isinstance(exc, InvalidRequest) and exc.param == "max_new_tokens":
        return type(exc)(str(exc).replace("max_new_tokens", max_tokens_field), max_tokens_field)
    return exc


# --- replies ----------------------------------------------------------------------------------
def new_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def timings_of(timeline: Timeline, streamed: bool = True) -> dict:
    """The glossary's metrics and raw events of one request (ms from the server's receipt), and
    the same figures under llama.cpp's `timings` names (prompt_n, predicted_ms...), so a client
    written for llama.cpp's server reads them too. Unknown is null, never 0. `streamed`: false for
    a `stream: false` reply, whose client saw no token before `e2e_ms` whatever `ttft_ms` says."""
    d = timeline.to_dict()
    d["streamed"] = streamed
    d.pop("received_ns", None)  # a perf_counter reading means nothing outside this process
    d.pop("client", None)  # browser timestamps join later, on the page
    d.update(timeline.llama_cpp_timings())
    return jsonable(d)


def metrics_of(timeline: Timeline) -> dict:
    """vLLM's per-request `metrics` object (its TTFT from scheduling, queue time apart)."""
    return jsonable(timeline.vllm_metrics())


def usage_of(timeline: Timeline) -> dict:
    prompt, out = timeline.prompt_tokens, timeline.output_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": out,
        "total_tokens": None if prompt is None else prompt + out,
        "prompt_tokens_details": {"cached_tokens": timeline.cached_tokens},
    }


def completion_body(cid: str, created: int, model: str, text: str, finish_reason: str | None,
                    timeline: Timeline) -> dict:
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_of(timeline),
        "timings": timings_of(timeline, streamed=False),
        "metrics": metrics_of(timeline),
    }


def chunk_body(cid: str, created: int, model: str, delta: dict | None, finish_reason: str | None = None,
               **extra) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}]
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": None, "choices": choices, **extra}


def sse(data) -> str:
    """One server-sent event: `data: JSON` and a blank line (OpenAI's stream framing)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


def now_s() -> int:
    return int(time.time())


def jsonable(value):
    """Counters come from several features: make sure whatever they hold serializes."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        return float(value)  # numpy / torch scalars
    except (TypeError, ValueError):
        return str(value)


# --- errors -----------------------------------------------------------------------------------
class APIError(Exception):
    """An error to answer with an OpenAI-style JSON body and an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def api_error_from(exc: BaseException) -> APIError:
    """Our exceptions → OpenAI status codes and error types. Bad input is never a 5xx."""
    from engine.core.request import QueueFull

    if isinstance(exc, APIError):
        return exc
    status = getattr(exc, "status", None)  # a remote server's own answer, passed through
    if isinstance(status, int) and 400 <= status < 600 and hasattr(exc, "error_type"):
        return APIError(status, str(exc), exc.error_type, getattr(exc, "param", None), getattr(exc, "code", None))
    if isinstance(exc, ContextOverflow):
        return APIError(400, str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, InvalidRequest):
        return APIError(400, str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, QueueFull):
        return APIError(429, str(exc), type="rate_limit_error", code="queue_full")
    if isinstance(exc, LatencyLabError):  # the server is shutting down, a remote is unreachable...
        return APIError(503, str(exc), type="server_error", code="unavailable")
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")
