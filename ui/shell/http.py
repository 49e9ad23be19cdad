"""How a user's error leaves a /lab route: a 4xx whose body is {message, param, type}, which the
page shows where the action was (never a 500, never a traceback)."""

from __future__ import annotations

from fastapi import HTTPException

from engine.core.errors import LatencyLabError


def refused(status: int, exc: Exception) -> HTTPException:
    return HTTPException(status, {"message": str(exc), "param": getattr(exc, "param", None), "type": type(exc).__name__})


def call(fn, *args, status: int = 400):
    """fn(*args); a LatencyLabError becomes a 4xx with its message."""
    try:
        return fn(*args)
    except LatencyLabError as exc:
        raise refused(status, exc) from exc
