"""The Load tab's endpoints under /lab/load: start a pair of runs, poll it, stop it.

The runs' clients call this same server's API (/v1/chat/completions) on loopback, with the
starting request's own credentials (cookie or bearer), so a server with --api-key works too."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from engine.core.errors import LatencyLabError

from ..shell.http import refused
from .report import delta_html
from .run import LoadBusy, LoadRunner

FORWARDED = ("authorization", "cookie")


class LoadIn(BaseModel):
    settings: dict = Field(default_factory=dict)


def loopback_url(request: Request) -> str:
    """This server as its own clients reach it: the port it listens on, at 127.0.0.1 when it listens
    on every address."""
    host, port = request.scope.get("server") or ("127.0.0.1", 7860)
    host = "127.0.0.1" if host in ("0.0.0.0", "", None) else "[::1]" if host == "::" else host
    return f"http://{'[' + host + ']' if ':' in host and not host.startswith('[') else host}:{port}"


def load_router(runner: LoadRunner, has_api: bool) -> APIRouter:
    """The closed-loop pairs' endpoints, and the open-loop sweeps' (/lab/load/open, same runner's engines)."""
    from .open_run import OpenLoopRunner

    def pair_snapshot(pair) -> dict:
        out = pair.to_dict()
        if out["sentence"]:
            out["delta_html"] = delta_html(*pair.runs)
        return out

    router = APIRouter(prefix="/lab/load")
    router.include_router(_runs_router(OpenLoopRunner(runner), has_api, "/open", lambda run: run.to_dict()))
    router.include_router(_runs_router(runner, has_api, "", pair_snapshot))
    return router


def _runs_router(runner, has_api: bool, prefix: str, snapshot) -> APIRouter:
    """Start, poll and stop for a runner of load runs (closed-loop pairs, open-loop sweeps): its
    `start(settings, url, headers)`, `get(id)` (LatencyLabError: unknown) and each run's `stop`
    event; `snapshot(run)` is what a poll returns."""
    router = APIRouter(prefix=prefix)

    def get(run_id: str):
        try:
            return runner.get(run_id)
        except LatencyLabError as exc:
            raise refused(404, exc) from exc

    @router.post("/start")
    async def start(body: LoadIn, request: Request):
        if not has_api:
            raise HTTPException(400, {"message": "the Load tab needs the API on this server (/v1/chat/completions): "
                                                 "start the page with app.py, which mounts it"})
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
        try:
            run = runner.start(body.settings, loopback_url(request), headers)
        except LoadBusy as exc:
            raise refused(409, exc) from exc
        except LatencyLabError as exc:
            raise refused(400, exc) from exc
        return {"id": run.id}

    @router.get("/{run_id}")
    async def poll(run_id: str):
        return snapshot(get(run_id))

    @router.post("/{run_id}/stop")
    async def stop(run_id: str):
        get(run_id).stop.set()
        return {"stopping": True}

    return router
