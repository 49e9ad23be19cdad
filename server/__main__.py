"""`python -m server`: the API and /metrics alone (no page), on 127.0.0.1:7860 by default.

`pip install .` also installs it as the `latency-lab-server` command.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from .cli import server_parser

    return server_parser("python -m server", __doc__.splitlines()[0])


def main(argv: list[str] | None = None) -> int:
    from engine.cli import load_config_from_args
    from engine.core.errors import EXIT_FAILURE, LatencyLabError, exit_code

    from . import build_backends, create_api
    from .cli import device_line, start_line

    args = build_parser().parse_args(argv)
    try:
        from engine.lab import open_engine

        backends = build_backends(args, lambda: open_engine(load_config_from_args(args), max_queue=args.max_queue))
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code(exc)
    import uvicorn

    if device := device_line(backends):
        print(device, file=sys.stderr)
    engine = start_line(args)
    print(f"serving {', '.join(backends)} on http://{args.host}:{args.port}/v1 "
          f"({engine + ', ' if engine else ''}auth {'on' if args.api_key else 'off'}); metrics at /metrics",
          file=sys.stderr)
    try:
        uvicorn.run(create_api(backends, api_key=args.api_key, otlp_endpoint=args.otlp_endpoint),
                    host=args.host, port=args.port, log_level="warning")
    except SystemExit as exc:  # uvicorn exits 3 when it cannot start (the port is taken...)
        if exc.code:
            print(f"error: the server could not start on {args.host}:{args.port}", file=sys.stderr)
            return EXIT_FAILURE
    return 0


if __name__ == "__main__":
    sys.exit(main())
