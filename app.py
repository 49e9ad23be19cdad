"""Latency Lab: `python app.py` serves the page, its endpoints and the API on http://127.0.0.1:7860.

One FastAPI app on one port: the OpenAI-compatible API (/v1, /metrics), the page's own endpoints
(/lab) and the Gradio page (/). Binds 127.0.0.1 unless --host says otherwise; no public share link
unless --share. `pip install .` (no editable install needed: pyproject finds every package)
installs it as the `latency-lab` command, beside `latency-lab-cli` (python -m engine) and
`latency-lab-server` (python -m server). `latency-lab report` (app.py report) measures this machine
instead: `python -m engine.bench report` (engine/bench/report.py).
Exit codes: 0 ok, 1 runtime failure (the model does not load, the port is taken...), 2 usage.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_parser() -> argparse.ArgumentParser:
    """`python -m server`'s flags (server.cli.server_parser: the same defaults) and the page's own."""
    from server.cli import server_parser

    prog = "latency-lab" if os.path.basename(sys.argv[0]) == "latency-lab" else "python app.py"
    p = server_parser(prog, __doc__.splitlines()[0])
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link (needs internet)")
    p.add_argument("--paced-source", type=float, default=None, metavar="TOK_PER_S",
                   help="no model: a test source emitting tokens at this rate (to measure the page itself)")
    p.add_argument("--paced-think", action="store_true",
                   help="with --paced-source: each reply opens with a scripted <think> block (a thinking model's)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:  # `latency-lab report ...`: measure this machine (engine/bench/report.py)
        from engine.bench import main as bench_main

        return bench_main(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.paced_think and not args.paced_source:
        parser.error("--paced-think needs --paced-source TOK_PER_S")
    import uvicorn

    from engine.cli import load_config_from_args
    from engine.core.errors import EXIT_FAILURE, LatencyLabError, exit_code
    from server import build_backends, create_api
    from ui.webapp import create_app

    try:
        if args.paced_source:
            from ui.chat.paced import PacedSource

            backends = {"paced test source": PacedSource(args.paced_source, think=args.paced_think)}
        else:
            from engine.lab import open_engine

            backends = build_backends(args, lambda: open_engine(load_config_from_args(args), max_queue=args.max_queue))
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code(exc)
    api = create_api(backends, api_key=args.api_key, otlp_endpoint=args.otlp_endpoint)
    # The page drives the API's instrumented backends, so its requests show in /metrics too.
    app = create_app(api.state.backends, app=api)
    if args.share:
        _share(args.host, args.port)
    from engine.platform import capabilities
    from server.cli import device_line, start_line

    print(f"this machine: {capabilities.detect().summary()}", file=sys.stderr)
    if device := device_line(backends):
        print(device, file=sys.stderr)
    engine = "" if args.paced_source else start_line(args)
    print(f"Latency Lab on http://{args.host}:{args.port}{f' ({engine})' if engine else ''}", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except SystemExit as exc:  # uvicorn exits 3 when it cannot start (the port is taken...)
        if exc.code:
            print(f"error: the server could not start on {args.host}:{args.port}", file=sys.stderr)
            return EXIT_FAILURE
    finally:
        for backend in backends.values():
            backend.close()
    return 0


def _share(host: str, port: int) -> None:
    """Open Gradio's public tunnel to this port once the server listens (needs internet)."""
    import secrets
    import threading
    import time

    from gradio import networking

    def open_tunnel():
        time.sleep(2)
        try:
            url = networking.setup_tunnel(host, port, secrets.token_urlsafe(32), None, None)
            print(f"public link: {url}", file=sys.stderr)
        except Exception as exc:  # no internet here is the usual reason
            print(f"--share: could not open a public link ({exc}); serving on {host}:{port} only", file=sys.stderr)

    threading.Thread(target=open_tunnel, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
