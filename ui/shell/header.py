"""The page's header: the engine, the machine's measured limits (with a re-measure button), the link
to the newest `latency-lab report`, the machine's capabilities and the clock offset; and its routes
under /lab: the limits (read, re-measured) and the report."""

from __future__ import annotations

import asyncio
import html

import gradio as gr
from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from engine.core.info import EngineInfo

from . import engine_info

LIMITS_HOVER = ("Measured on this machine at first start (engine/measure/machine_limits.py), best of interleaved "
                "rounds: memory read bandwidth (a sum over a buffer far past the caches), copy bandwidth (for "
                "reference) and matmul throughput per dtype. Each reply's prefill is shown against the matmul "
                "peak, its decode against the read bandwidth.")
REPORT_HOVER = ("the newest `latency-lab report` of this machine: limits, decode per weights variant, KV reuse, "
                "prompt lookup, batching")


def build(info: EngineInfo) -> None:
    esc = html.escape
    gr.HTML(f'<div class="lab-header"><div><h1>Latency Lab</h1><span class="lab-sub">where an LLM reply\'s time '
            f'goes: measured by the server, perceived by your browser</span></div><div class="lab-engine">'
            f'{esc(info.headline())}<br><span id="lab-limits" title="{esc(LIMITS_HOVER)}">'
            f'{esc(engine_info.limits_line(info))}</span> <button id="lab-limits-rerun" type="button" '
            f'class="lab-linkbtn">re-measure</button> · <a id="lab-report-link" href="/lab/report.html" target="_blank" '
            f'title="{esc(REPORT_HOVER)}">latest report</a><br><span id="lab-machine" class="lab-muted">'
            f'{esc((info.capabilities or {}).get("summary") or "")}</span><br>'
            f'<span id="lab-clock">clock offset: measuring…</span>'
            f'</div></div>')


def header_router(store) -> APIRouter:
    """`store`: the page's ChatStore (its default backend, and that backend's description)."""
    router = APIRouter(prefix="/lab")

    @router.get("/limits")
    async def limits():
        """The machine's measured limits (read and copy bandwidth, matmul peaks), as the page header shows them."""
        return engine_info.limits_json(store.info)

    @router.post("/limits")
    async def remeasure():
        """Probe the machine again (the header's button): 1–2 s, off the event loop."""
        backend, engine = store.engine(None)
        if not hasattr(engine, "remeasure_limits"):
            raise HTTPException(400, {"message": "this backend cannot measure its machine (a remote or test source)"})
        await asyncio.to_thread(engine.remeasure_limits)
        store.refresh_info(backend)
        return engine_info.limits_json(store.info)

    @router.get("/report")
    async def latest_report():
        """The newest `latency-lab report` of this machine (engine/bench/report.py), its report.md as text."""
        from engine.bench import report

        folder = report.latest(report.default_root())
        if folder is None:
            return Response("No report on this machine yet: run `latency-lab report` (about 10 minutes on 2 cores).\n",
                            status_code=404, media_type="text/plain; charset=utf-8")
        return Response((folder / "report.md").read_text(), media_type="text/plain; charset=utf-8")

    @router.get("/report.html")
    async def latest_report_html():
        """The newest report as one self-contained page (engine/bench/report.py `html_of`): the header's link."""
        from engine.bench import report

        folder = report.latest(report.default_root())
        if folder is None:
            return await latest_report()
        return Response(report.html_of(folder), media_type="text/html; charset=utf-8")

    return router
