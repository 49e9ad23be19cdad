"""`python -m server.bench SCENARIO [--json]`: the bench scenarios that need our HTTP server.

They run exactly like `python -m engine.bench` ones (same load flags, figures printed by the tool,
`--json`, exit codes); they live here because engine/ imports neither server/ nor ui/.
"""

from __future__ import annotations

import sys

from engine import bench

SCENARIOS = {
    "load": "N concurrent streaming clients through the API: nothing lost, crossed or stuck; latency per level",
    "remote": "an OpenAI-compatible server measured from the client (default: our own API on loopback)",
}


def build_parser(argv: list[str] | None = None):
    return bench.build_parser(argv, SCENARIOS, __name__)


def main(argv: list[str] | None = None) -> int:
    return bench.main(argv, SCENARIOS, __name__)


if __name__ == "__main__":
    sys.exit(main())
