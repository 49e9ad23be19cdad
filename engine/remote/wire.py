"""What the remote engine sends a server and how it reads a server's objects and errors back.

The request bodies (OpenAI-style chat completions, Ollama's native chat), one streamed JSON
object checked, and an error answer turned into a RemoteError with the server's own fields.
"""

from __future__ import annotations

import json

from engine.core.config import TOGGLE, TOGGLES, GenerationConfig
from engine.core.errors import LatencyLabError

# The toggles another Latency Lab honours: derived from their one declaration (engine/core/config.py).
FORWARDED = tuple(t.name for t in TOGGLES if "remote-lab" in t.backends)


class RemoteError(LatencyLabError):
    """The remote server refused or failed a request; its HTTP status and error fields are kept."""

    def __init__(self, message: str, status: int = 502, error_type: str = "server_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.error_type, self.param, self.code = status, error_type, param, code


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
        body.update({name: getattr(cfg, name) for name in FORWARDED if getattr(cfg, name) != TOGGLE[name].default})
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


def json_object(text: str, what: str) -> dict:
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
