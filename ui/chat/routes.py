"""The chat's endpoints under /lab: a tab's session, the token stream (SSE), stop, clear, a preset's
history, the clock pings, a turn's one request after its stream (the browser's timings up, the row
back), the per-tab table and its exports.

Why the token stream bypasses Gradio's queue: the page needs each chunk's arrival time in the
browser, and Gradio delivers a streamed output as a component update (whole values, diffed and
re-rendered, several coalesced into one). Our stream is a plain SSE response read by our own
JavaScript, one event per chunk, so arrival and paint are stamped per chunk. The Gradio route
stays available (`transport: gradio` in the page) to measure what it adds.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse

from engine.core.errors import LatencyLabError
from engine.core.request import QueueFull
from engine.core.timeline import Timeline

from ..shell.http import call, refused
from . import network, record_view, records, stress
from .stress import StressSources
from .store import ChatStore
from .settings import PaneSettings


class ChatIn(BaseModel):
    session: str
    pane: str = "chat"
    message: str | None = None
    settings: dict = Field(default_factory=dict)
    regenerate: bool = False
    stress_tps: float | None = None  # the stress run: the paced source's long reply at this rate (ui/chat/stress.py)


class PaneIn(BaseModel):
    session: str
    pane: str = "chat"


class SeedIn(PaneIn):
    preset: str


class TurnIn(BaseModel):
    session: str
    request_id: str
    client: dict  # the browser's timestamps of the reply (ui/chat/client_timing.js Recorder.toClient)
    table: bool = False  # the tab shows its table of replies: it comes back too


def lab_router(store: ChatStore, presets: dict | None = None, after_turn: tuple = ()) -> APIRouter:
    """`after_turn`: what other features add under a finished reply, each (session, reply) → {key: value}
    merged into the turn's answer (ui/insight/routes.py: the speculation replay)."""
    router = APIRouter(prefix="/lab")
    stress_sources = StressSources()

    @router.post("/chat")
    async def chat(body: ChatIn):
        settings = call(PaneSettings.read, body.settings, list(store.engines))  # once: the turn takes it as read
        link = network.link_for(settings.page)
        if link.simulated:  # network in: the request travels before the server can stamp it
            await asyncio.sleep(link.one_way_s(random.Random(), len(body.model_dump_json())))
        timeline = Timeline()  # "request received by the server": stamped before anything else
        try:
            source = None if body.stress_tps is None else stress_sources.source(body.stress_tps)
            stream = store.run_turn(body.session, body.pane, body.message, settings,
                                    regenerate=body.regenerate, timeline=timeline, source=source,
                                    max_new_tokens=None if source is None else stress.tokens_at(body.stress_tps))
            first = await anext(stream)  # bad input fails here, before the stream starts
        except QueueFull as exc:
            raise refused(429, exc) from exc
        except LatencyLabError as exc:
            raise refused(400, exc) from exc

        async def produced():
            yield first
            async for item in stream:
                yield item

        async def events():  # network out (simulated, if set) and streaming on/off happen here
            async for kind, data in network.deliver(produced(), link, settings.page["streaming"], size=_wire_bytes):
                yield {"event": kind, "data": json.dumps(data)}

        # No pings: a ping would interleave with chunks and the page has its own stop.
        return EventSourceResponse(events(), headers={"Cache-Control": "no-store"})

    @router.post("/session")
    async def new_session():
        """Each browser tab asks for its own session: its conversations and prefix-cache scope."""
        return {"session": store.new_session()}

    @router.post("/stop")
    async def stop(body: PaneIn):
        return {"stopped": call(store.cancel, body.session, body.pane)}

    @router.post("/clear")
    async def clear(body: PaneIn):
        call(store.clear, body.session, body.pane)
        return {"cleared": True}

    @router.post("/seed")
    async def seed(body: SeedIn):
        """Start a pane from a preset conversation; the text comes from the server's presets."""
        preset = (presets or {}).get(body.preset)
        if preset is None:
            raise HTTPException(404, {"message": f"no preset named {body.preset!r}"})
        call(store.seed, body.session, body.pane, preset.get("history", []))
        return {"messages": preset.get("history", [])}

    @router.get("/clock")
    async def clock():
        """The server clock for the page's offset estimate (NTP-style, minimum round trip)."""
        return {"server_ms": time.perf_counter_ns() / 1e6}

    def table_html(session: str, pane: str | None) -> str:
        return record_view.table_html([r.row() for r in call(store.replies, session, pane)], TABLE_COLUMNS)

    @router.post("/turn")
    async def turn(body: TurnIn):
        """A finished reply's one request after its stream: the browser's timings go up (joined to the
        reply's Timeline), its row, stats line and what happened come back, with the tab's table when it is
        shown and what each feature adds under a reply (`after_turn`); `server_ms` is the server's clock
        as it answers, a sample of the clock offset like a ping's."""
        reply = call(store.join_timing, body.session, body.request_id, body.client)
        r = reply.row()
        out = {"row": r, "stats_html": record_view.stats_line_html(r),
               "perceived_html": record_view.perceived_line_html(r), "what_happened": record_view.what_happened(r),
               "client": reply.timeline.client}
        if body.table:  # the chat's table is its own pane's; the A/B tab's, every pane's
            out["table_html"] = table_html(body.session, "chat" if reply.pane == "chat" else None)
        for part in after_turn:
            out.update(part(body.session, reply))
        out["server_ms"] = time.perf_counter_ns() / 1e6
        return out

    @router.get("/table")
    async def table(session: str, pane: str | None = None):
        """The tab's table of replies (when the page opens it)."""
        html = table_html(session, pane)
        return {"html": html, "count": len(store.replies(session, pane))}

    @router.get("/export/{session}.{fmt}")
    async def export(session: str, fmt: str, pane: str | None = None):
        replies = call(store.replies, session, pane)
        name = f"latency-lab-{session.removeprefix('sess_')[:8]}{'-' + pane if pane else ''}"
        if fmt == "csv":
            body, media = records.rows_to_csv([r.row() for r in replies]), "text/csv"
        elif fmt == "json":
            body, media = records.records_to_json([r.record() for r in replies]), "application/json"
        else:
            raise HTTPException(404, {"message": "export as .csv or .json"})
        return Response(body, media_type=media,
                        headers={"Content-Disposition": f'attachment; filename="{name}.{fmt}"'})

    return router


TABLE_COLUMNS = ["turn", "pane", "config", "ttft_ms", "client_ttft_ms", "transport_overhead_ms", "tpot_ms",
                 "decode_tps", "e2e_ms", "client_e2e_ms", "queue_ms", "prefill_ms", "prefill_tps", "prompt_tokens",
                 "cached_tokens", "output_tokens", "context_tokens", "prefill_compute_fraction",
                 "decode_bandwidth_fraction", "acceptance_rate", "finish_reason"]


def _wire_bytes(item) -> int:
    """An event's size on the wire (its SSE frame), for the simulated link's bandwidth."""
    kind, data = item
    return len(kind) + len(json.dumps(data)) + 16
