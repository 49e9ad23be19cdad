"""Latency Lab's HTTP side: the OpenAI-compatible API, Prometheus metrics, server flags.

The engine (`engine/`) knows nothing of HTTP; this package adapts it. See server/api.py.
"""

from .api import create_api
from .cli import add_server_args, build_backends

__all__ = ["add_server_args", "build_backends", "create_api"]
