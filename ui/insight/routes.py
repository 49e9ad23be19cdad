"""One reply's insight: its speculation replayed (ui/insight/replay.py), which comes back with the reply's
turn (`replay_part`, one of ui/chat/routes.py's `after_turn`), and the what-if's endpoints under /lab
(engine/measure/whatif.py, ui/insight/whatif_view.py)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from engine.core.errors import LatencyLabError
from engine.measure import whatif
from engine.serving.work import ModelShape

from ..chat.store import ChatStore
from ..shell import engine_info
from . import replay, whatif_view


def replay_part(store: ChatStore):
    """What a finished reply's turn (ui/chat/routes.py `after_turn`) brings back for its speculation:
    {"replay_html": the block under the reply ('' without speculation), "replay_figures": acceptance by
    position, predicted and measured speedups (None without)}."""
    decode = store.decoder()

    def part(session: str, reply) -> dict:
        tl = reply.timeline.to_dict()
        if decode is None or not tl.get("draft_step_count"):
            return {"replay_html": "", "replay_figures": None}
        return {"replay_html": replay.replay_html(tl, store.token_ids(session, reply), decode),
                "replay_figures": replay.figures(tl) if tl.get("draft_steps") else None}

    return part


def insight_router(store: ChatStore) -> APIRouter:
    router = APIRouter(prefix="/lab")

    def reply_of(session: str, request_id: str):
        try:
            return store.reply(session, request_id)
        except LatencyLabError as exc:
            raise HTTPException(400, {"message": str(exc)}) from exc

    def model_of(reply):
        """The reply's backend's model shape, or None (a remote or test source: no model here)."""
        engine = store.engines.get(reply.settings.get("backend") or next(iter(store.engines)))
        loaded = getattr(engine, "loaded", None)
        try:
            return ModelShape.of(loaded.model) if loaded is not None else None
        except AttributeError:
            return None

    def variant_bytes(reply, variant: str):
        if not variant:
            return None
        info = store.infos.get(reply.settings.get("backend") or next(iter(store.infos)))
        found = engine_info.weight_bytes(info, variant) if info else None
        if found is None:
            raise HTTPException(400, {"message": f"the bytes of '{variant}' are known once it is built: run one "
                                                 "reply with it first"})
        return found

    @router.get("/whatif")
    async def whatif_predict(session: str, request_id: str, factor: float = 1.0, variant: str = "", batch: int = 1):
        """The reply's TTFT/TPOT predicted with a prompt `factor` × as long, another weights variant, a
        batch of `batch`; with `factor` ≠ 1, the longer message to run for the check."""
        if not 0.1 <= factor <= 64 or not 1 <= batch <= 256:
            raise HTTPException(400, {"message": "factor must be in 0.1–64 and batch in 1–256"})
        reply = reply_of(session, request_id)
        shape = model_of(reply)
        if shape is None:
            return {"html": '<span class="lab-muted">no what-if for this backend: its model is not here</span>',
                    "message": None}
        tl = reply.timeline.to_dict()
        message, n = None, None
        if factor != 1.0:
            longer, base_n, long_n = whatif.longer_messages(decode_tokenizer(reply), [
                {"role": "user", "content": reply.prompt}], factor)
            message = longer[-1]["content"]
            n = max(1, round((tl.get("prefill_tokens") or 1) + long_n - base_n))
        parts = [f"prompt × {factor:g}" if factor != 1.0 else "", f"weights {variant}" if variant else "",
                 f"batch {batch}" if batch != 1 else ""]
        p = whatif.predict(tl, shape, prefill_tokens=n, weight_bytes=variant_bytes(reply, variant), batch=batch)
        return {"html": whatif_view.prediction_html(p, ", ".join(x for x in parts if x) or "as it ran"),
                "message": message, "prediction": p.to_dict() if p else None}

    @router.get("/whatif/check")
    async def whatif_check(session: str, base: str, measured: str, variant: str = "", batch: int = 1):
        """The base reply's prediction at the prompt the measured reply really ran, against its figures."""
        b, m = reply_of(session, base), reply_of(session, measured)
        shape = model_of(b)
        c = None if shape is None else whatif_view.check(b.timeline.to_dict(), m.timeline.to_dict(), shape,
                                                         variant_bytes(b, variant), batch)
        return {"html": whatif_view.check_html(c), "check": c}

    def decode_tokenizer(reply):
        engine = store.engines.get(reply.settings.get("backend") or next(iter(store.engines)))
        return engine.tokenizer

    return router
