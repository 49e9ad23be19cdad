"""The OpenAI chat-completions wire format: read a request body, write replies, chunks and errors.

Plain functions over dicts, no HTTP. A body is read by a pydantic model (`ChatBody`): the OpenAI
fields, the standard ones we accept and ignore or refuse, and every GenerationConfig field under
its API name, typed from its one declaration (engine/core/config.py). A refusal keeps the words
the API has always used: each validation error is mapped once, by its `loc` and `type`, to our
message (a declared field's own `check`, so the API, the CLI and the page refuse a value alike).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    StringConstraints,
    ValidationError,
    create_model,
)

from engine.core.config import SAMPLING, GenerationConfig
from engine.core.config import TOGGLES as CONFIG_TOGGLES
from engine.core.errors import ContextOverflow, InvalidRequest, LatencyLabError
from engine.core.request import validate_messages
from engine.core.timeline import Timeline
from engine.core.toggles import Toggle

MAX_SESSION_CHARS = 200
MAX_SCOPE_CHARS = 64
# Our optimization toggles, accepted as extra body fields (the openai SDK sends them via extra_body);
# derived from their one declaration (engine/core/config.py).
TOGGLES = tuple(t.name for t in CONFIG_TOGGLES if "local" in t.backends)
# The API's names of the sampling fields where OpenAI's differ from ours. max_completion_tokens is the
# current name; max_tokens the older one that most servers take (when both are given, the current wins).
API_NAMES = {"max_new_tokens": ("max_completion_tokens", "max_tokens")}
# Standard OpenAI fields accepted and ignored (they change nothing a local engine does).
IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort",
           "safety_identifier", "prompt_cache_key", "verbosity", "web_search_options")
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


# --- the body ---------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)  # other keys are OpenAI's business, not ours: ignored
    include_usage: StrictBool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]


def _off(allowed: tuple):
    def check(value):
        if value not in allowed:
            raise ValueError("not supported")
        return value
    return AfterValidator(check)


def _declared_type(t: Toggle):
    """A GenerationConfig field's type in the body, from its declaration. Each string's length is left
    to the GenerationConfig the body makes (its `__post_init__`): pydantic refuses to measure text with a
    lone surrogate, which JSON allows and a stop string may hold."""
    if t.kind == "bool":
        return StrictBool
    if t.kind == "int":
        return Annotated[int, Field(ge=t.lo, le=t.hi)]
    if t.kind == "float":
        low = {"gt": t.lo} if t.lo_open else {"ge": t.lo}
        return Annotated[float, Field(le=t.hi, allow_inf_nan=False, **low)]
    if t.kind == "choice":
        return Literal[t.choices]
    if t.kind == "variant":
        return StrictStr
    if t.kind == "strings":  # OpenAI's stop: a string or a list of them
        return Annotated[list[StrictStr], Field(max_length=t.hi),
                         BeforeValidator(lambda v: [v] if isinstance(v, str) else v)]
    raise TypeError(f"{t.name}: no body type for kind {t.kind!r}")


DECLARED = {name: t for t in (*SAMPLING, *CONFIG_TOGGLES) if t.sampling or t.name in TOGGLES
            for name in API_NAMES.get(t.name, (t.name,))}  # API name -> declaration
_Session = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_SESSION_CHARS)]
_Scope = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_SCOPE_CHARS)]
ChatBody = create_model(  # messages: the one check (validate_messages); a Request takes the Messages it makes as they are
    "ChatBody", __config__=ConfigDict(strict=True, extra="forbid"),
    model=(StrictStr | None, None),
    messages=(Annotated[Any, AfterValidator(lambda m: validate_messages(_messages(m))),
                        Field(validate_default=True)], None),
    **{name: (Annotated[Any, _off(allowed)], None) for name, allowed in UNSUPPORTED.items()},
    n=(Annotated[int, Field(ge=1, le=1)] | None, None),
    response_format=(ResponseFormat | None, None),
    stream=(StrictBool | None, None),
    stream_options=(StreamOptions | None, None),
    session=(_Session | None, None),
    batch_scope=(_Scope | None, None),
    **{name: (_declared_type(t) | None, None) for name, t in DECLARED.items()},
    **{name: (Any, None) for name in IGNORED},
)
RANK = [*ChatBody.model_fields]  # which error a body with several hears: the first field in this order
_FIXED = {  # fields whose every error has one message
    "model": "model must be a string",
    "n": "only n=1 is supported",
    "response_format": "only response_format {\"type\": \"text\"} is supported",
    "stream": "stream must be true or false",
    "stream_options": "stream_options must be an object",
    "session": f"session must be a string of 1 to {MAX_SESSION_CHARS} characters",
    "batch_scope": f"batch_scope must be a string of 1 to {MAX_SCOPE_CHARS} characters",
}


def parse_chat_request(body) -> ChatRequest:
    """Map an OpenAI request body onto a GenerationConfig; raise InvalidRequest(param=...) on bad input."""
    try:
        b = ChatBody.model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc, body) from None
    field = "max_completion_tokens" if b.max_completion_tokens is not None else "max_tokens"
    given = {t.name: getattr(b, name) for name, t in DECLARED.items() if name not in API_NAMES.get(t.name, ())}
    given["max_new_tokens"] = getattr(b, field)
    config = GenerationConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None})
    include_usage = bool(b.stream_options and b.stream_options.include_usage)
    return ChatRequest(b.model, b.messages, config, bool(b.stream), include_usage, b.session, field,
                       b.batch_scope)


def _refusal(exc: ValidationError, body) -> InvalidRequest:
    """The one refusal a client hears for a body pydantic refused: its first error, in our words."""
    errors = exc.errors()
    extra = sorted(e["loc"][0] for e in errors if e["type"] == "extra_forbidden")
    errors = sorted((e for e in errors if e["type"] != "extra_forbidden"), key=lambda e: RANK.index(e["loc"][0])
                    if e["loc"] and e["loc"][0] in RANK else -1)
    first = errors[0] if errors else None
    if first is not None and not first["loc"]:
        return InvalidRequest("the request body must be a JSON object", None)
    if extra and (first is None or RANK.index(first["loc"][0]) > RANK.index("model")):
        name = extra[0]
        plain = name.isascii() and name.isprintable() and len(name) <= 64
        said = f"unknown field {name!r}" if plain else "a field name that is not plain text"  # never echo that
        return InvalidRequest(f"{said}: this server reads the OpenAI chat fields and its toggles ({', '.join(TOGGLES)})",
                              name if plain else None)
    name, kind = first["loc"][0], first["type"]
    if first["loc"] == ("stream_options", "include_usage"):
        return InvalidRequest("include_usage must be true or false", "stream_options.include_usage")
    if name in _FIXED:
        return InvalidRequest(_FIXED[name], name)
    if name in UNSUPPORTED:
        return InvalidRequest(f"{name} is not supported by this server", name)
    if isinstance((first.get("ctx") or {}).get("error"), InvalidRequest):  # messages: validate_messages' own words
        return first["ctx"]["error"]
    t = DECLARED[name]
    if t.kind == "strings" and kind == "list_type":
        return InvalidRequest(f"{name} must be a string or a list of strings", name)
    try:  # the declaration's words for this value
        t.check(_body_value(body, name), name)
    except InvalidRequest as refused:
        return refused
    return InvalidRequest(f"{name}: {first['msg']}", name)  # pydantic refused what the declaration takes


def _body_value(body: dict, name: str):
    """A field's value as GenerationConfig would hold it (stop: a tuple of strings), not coerced."""
    value = body[name]
    if DECLARED[name].kind == "strings":
        return (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else value
    return value


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


def in_api_terms(exc: Exception, max_tokens_field: str) -> Exception:
    """Point an engine error raised while running (the context cannot hold max_new_tokens more) at the
    API's field name. The engine words it with its own name; the body's own errors never get here."""
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
