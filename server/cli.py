"""Server flags (`add_server_args`, `server_parser`) and the engines they name (`build_backends`).

app.py and `python -m server` share these (one parser builder, so their defaults cannot drift apart).
`--api-key` protects this server (API, page, /lab); the key sent to a remote server is a separate flag
(`--remote-api-key`), so our own key never leaves the machine.
"""

from __future__ import annotations

import argparse
import os

from engine.core.errors import InvalidRequest

BACKENDS = ("local", "openai", "both")
DEFAULT_MAX_QUEUE = 64
# Both servers batch: clients arrive together, and the page's Load tab compares max batch 1 and 8 on the
# running engine (a run's batch scope can only lower the engine's limit). A lone request still runs
# alone. `python -m engine` (one terminal user) keeps LoadConfig's 1.
DEFAULT_MAX_BATCH = 8


def server_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The flags of app.py and `python -m server`: model (max batch default DEFAULT_MAX_BATCH) and server."""
    from engine.cli import add_load_args

    p = argparse.ArgumentParser(prog=prog, description=description)
    add_load_args(p, max_batch=DEFAULT_MAX_BATCH)
    add_server_args(p)
    return p


def start_line(args) -> str:
    """What the start line says of the local engine ('' when there is none)."""
    return f"max batch {args.max_batch}" if args.backend in ("local", "both") else ""


def device_line(backends: dict) -> str | None:
    """'device: cuda:0 (NVIDIA H200, …)' or 'device: cpu: this torch is a CPU-only build …': which device the
    local engine serves on and why (engine/platform/device.py); None without a local engine."""
    for engine in backends.values():
        reason = getattr(engine, "loaded", None) and engine.loaded.device_reason
        if reason:
            return f"device: {reason}"
    return None


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    g.add_argument("--port", type=int, default=7860)
    g.add_argument("--max-queue", type=_non_negative, default=DEFAULT_MAX_QUEUE,
                   help="requests allowed to wait for the model; past it the API answers 429 and the page says the "
                        "server is busy (default %(default)s; a queue that grows without limit only grows the wait)")
    g.add_argument("--api-key", default=os.environ.get("LATENCY_LAB_API_KEY"),
                   help="require the key on every route but /health and /metrics: 'Authorization: Bearer KEY', "
                        "or a login form for the page (default: $LATENCY_LAB_API_KEY, else none)")
    g.add_argument("--otlp-endpoint", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
                   help="export every request as OpenTelemetry spans (a child per stage) over OTLP/HTTP to this "
                        "collector, e.g. http://127.0.0.1:4318 (default: $OTEL_EXPORTER_OTLP_ENDPOINT, else none; "
                        "docs/trace.md)")
    g = p.add_argument_group("remote engine")
    g.add_argument("--backend", default="local", choices=BACKENDS,
                   help="local: the engine in this process; openai: a remote OpenAI-compatible server "
                        "measured from here; both: one of each (A/B local vs remote)")
    g.add_argument("--base-url", default=None, help="the remote server's API root, e.g. http://host:8000/v1")
    g.add_argument("--remote-model", default=None, help="the model name the remote server serves")
    g.add_argument("--remote-api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer key for the remote server (default: $OPENAI_API_KEY)")
    g.add_argument("--remote-dialect", default="auto", choices=("auto", "openai", "ollama"),
                   help="auto: use Ollama's native API when the server is Ollama (asked once at start), "
                        "else its OpenAI API (default: auto)")


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def build_backends(args, load_local) -> dict:
    """{model name: engine} for the flags; `load_local()` returns the local Engine when one is needed."""
    backends = {}
    if args.backend in ("local", "both"):
        engine = load_local()
        backends[engine.info().name] = engine
    if args.backend in ("openai", "both"):
        if not args.base_url or not args.remote_model:
            raise InvalidRequest("--backend openai needs --base-url URL and --remote-model NAME", "base_url")
        from engine.remote.client import RemoteEngine

        remote = RemoteEngine(args.base_url, args.remote_model, api_key=args.remote_api_key,
                              dialect=getattr(args, "remote_dialect", "auto"))
        name = args.remote_model if args.remote_model not in backends else f"remote/{args.remote_model}"
        backends[name] = remote
    return backends
