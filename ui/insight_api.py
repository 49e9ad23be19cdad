"""The page's /lab endpoints for one reply's insight: its speculation replayed (ui/replay.py).
Kept apart from ui/stream_api.py (the chat's transport)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from engine.core.errors import LatencyLabError

from . import replay
from .ab_stats import token_ids
from .chat import ChatStore
from .sweep import decoder


def insight_router(store: ChatStore) -> APIRouter:
    router = APIRouter(prefix="/lab")
    decode = decoder(store)

    def reply_of(session: str, request_id: str):
        try:
            return store.reply(session, request_id)
        except LatencyLabError as exc:
            raise HTTPException(400, {"message": str(exc)}) from exc

    @router.get("/replay")
    async def replay_view(session: str, request_id: str):
        """A speculative reply step by step: {"html": the block under the reply ('' without
        speculation), "figures": acceptance by position, predicted and measured speedups}."""
        reply = reply_of(session, request_id)
        tl = reply.timeline.to_dict()
        if decode is None:
            return {"html": "", "figures": None}
        return {"html": replay.replay_html(tl, token_ids(store, session, reply), decode),
                "figures": replay.figures(tl) if tl.get("draft_steps") else None}

    return router
