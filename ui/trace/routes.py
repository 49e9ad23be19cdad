"""`POST /lab/trace`: the page's *Trace* downloads (ui/trace/trace.js), one Chrome Trace Event file per reply,
per A/B pair (both panes on one timeline) or per Load run (every request its own track). A body
({session, ids, labels}), not a query: a Load run's ids outgrow a URL.

A page reply is read from the tab's session (ui/chat/store.py), with the browser's timings joined and its
pane's simulated link named; an id the session does not hold (a Load run's requests, which go
through the API) is read from the API's finished requests (server/tracing.py) when the app has them.
The trace itself is built in one place, engine/measure/trace.py.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from engine.core.errors import LatencyLabError
from engine.measure.trace import chrome_trace

from ..chat import network
from ..chat.store import ChatStore, check_id

MAX_IDS = 2000  # a Load run's requests, at most


class TraceIn(BaseModel):
    session: str
    ids: list[str] = Field(min_length=1, max_length=MAX_IDS)
    labels: list[str | None] = Field(default_factory=list, max_length=MAX_IDS)  # one per id: the tracks' names


def trace_router(store: ChatStore) -> APIRouter:
    router = APIRouter(prefix="/lab")

    @router.post("/trace")
    async def trace(request: Request, body: TraceIn):
        try:
            store.session(body.session)  # a session of this server's, or a 400
            session, wanted = body.session, [check_id(i, "ids") for i in body.ids]
        except LatencyLabError as exc:
            raise HTTPException(400, {"message": str(exc), "param": exc.param}) from exc
        names = body.labels
        replies, links = [], {}
        api_traces = getattr(request.app.state, "traces", None)
        for k, rid in enumerate(wanted):
            label = names[k][:40] if k < len(names) and names[k] else None
            try:
                reply = store.reply(session, rid)
            except LatencyLabError:
                tl = api_traces.timeline(rid) if api_traces is not None else None
                if tl is None:
                    raise HTTPException(404, {"message": f"no finished reply {rid!r} here", "param": "ids"}) from None
                replies.append((label, tl.to_dict()))
                continue
            link = network.link_for(reply.settings)
            if link.simulated:
                links[rid] = link.describe()
            replies.append((label, reply.timeline.to_dict()))
        return chrome_trace(replies, network=links)

    return router
