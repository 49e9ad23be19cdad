"""`GET /lab/delta`: the A/B tab's table under a pair (ui/compare/ab.js): the delta table and its notes,
the TTFT change split into measured terms (attribution.py), and the paired statistics over this
prompt's repeated runs (repeated.py)."""

from __future__ import annotations

import html

from fastapi import APIRouter

from ..chat.store import ChatStore
from ..shell.http import call
from . import attribution, delta, repeated


def compare_router(store: ChatStore) -> APIRouter:
    router = APIRouter(prefix="/lab")
    decode = store.decoder()

    @router.get("/delta")
    async def pair_delta(session: str, a: str, b: str):
        ra, rb = call(store.reply, session, a), call(store.reply, session, b)
        row_a, row_b = ra.row(), rb.row()
        notes = [delta.transport_lesson(ra.record(), rb.record()), delta.replies_note(ra.record(), rb.record())]
        return {"html": delta.delta_html(delta.delta_rows(row_a, row_b), row_a["config"], row_b["config"])
                + "".join(f'<p class="lab-muted lab-replies-note">{html.escape(n)}</p>' for n in notes if n)
                + attribution.attribution_html(ra.timeline.to_dict(), rb.timeline.to_dict())
                + repeated.repeated_html(store, session, ra, rb, decode)}

    return router
