"""Conversations kept on the server, one per (browser tab, pane), and the turn that streams a reply.

The browser never sends history back: Gradio (and any HTML round trip) can change a reply's
text (it strips a leading newline), and a history rebuilt from that text no longer matches the
token ids the prefix cache holds. Each conversation keeps the text the engine produced, and
each reply keeps its `Timeline`, which the browser's timestamps later join (`join_timing`).
"""

from __future__ import annotations


import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from engine.core.errors import InvalidRequest
from engine.core.info import EngineInfo
from engine.core.timeline import Timeline
from engine.serving.sessions import Conversation, Message
from server.sessions import MAX_KEPT, Sessions

from ..shell import engine_info
from ..shell.form import choose
from . import records
from .settings import PaneSettings

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
PANES = ("chat", "A", "B")


def check_id(value, name: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidRequest(f"{name} must be 1-64 letters, digits or _.:-", name)
    return value


@dataclass
class Reply:
    request_id: str
    session: str
    pane: str
    turn: int
    settings: dict
    prompt: str
    timeline: Timeline
    text: str = ""

    def record(self) -> dict:
        return {"request_id": self.request_id, "session": self.session, "pane": self.pane, "turn": self.turn,
                "settings": self.settings, "prompt": self.prompt, "reply": self.text,
                "timeline": self.timeline.to_dict()}

    def row(self) -> dict:
        return records.row(self.record())


@dataclass
class Pane:
    """One tab pane: its conversation (engine.serving.sessions.Conversation, replies kept exactly as
    generated) and the request streaming into it now."""

    conversation: Conversation
    inflight: object | None = None  # the RequestHandle streaming now


@dataclass
class Session:
    """What a browser tab keeps on the server (in the session registry, server/sessions.py)."""

    panes: dict[str, Pane] = field(default_factory=dict)
    replies: list[Reply] = field(default_factory=list)

    @property
    def busy(self) -> bool:
        """A reply is streaming into one of its panes (the registry never drops it then)."""
        return any(p.inflight for p in self.panes.values())


class ChatStore:
    """All tabs' conversations. Their sessions are the server's (server/sessions.py): issued, checked
    and kept (bounded, the least recently used first) by the one registry the API's sessions use too.

    `engines` maps a backend name to an engine (anything with `submit`, `info`): the local
    engine, and later remote ones, so A/B can put a different backend in each pane.
    """

    def __init__(self, engines, max_sessions: int = MAX_KEPT, max_replies: int = 2000,
                 sessions: Sessions | None = None):
        """`sessions`: the server's registry (the API's, when the page is mounted on it); else one of its own."""
        self.engines = dict(engines) if isinstance(engines, dict) else {"local": engines}
        self.sessions = sessions or Sessions(keep=max_sessions)
        self.max_replies = max_replies
        self.infos = {name: engine_info.describe(e) for name, e in self.engines.items()}

    def refresh_info(self, backend: str) -> None:
        """Read a backend's description again (after its machine limits were re-measured)."""
        self.infos[backend] = engine_info.describe(self.engines[backend])

    @property
    def info(self) -> EngineInfo:
        """The first (default) backend's description."""
        return next(iter(self.infos.values()))

    def engine(self, backend: str | None):
        """(name, engine) of a backend (the default when none is named); InvalidRequest for another name."""
        name = choose(backend, list(self.engines), "backend")
        return name, self.engines[name]

    # --- sessions ----------------------------------------------------------------------------
    def new_session(self) -> str:
        """A browser tab's session: unguessable (it scopes the tab's prefix cache, so it must not be chosen,
        or guessed, by another client), issued by the server's registry."""
        return self.sessions.issue(Session())

    def session(self, session_id: str) -> Session:
        return self.sessions.state(session_id)

    def pane(self, session_id: str, pane: str) -> Pane:
        if pane not in PANES:
            raise InvalidRequest(f"pane must be one of {', '.join(PANES)}", "pane")
        panes = self.session(session_id).panes
        if pane not in panes:  # the conversation's session is its prefix-cache scope: one per pane
            panes[pane] = Pane(Conversation(session=f"{self.sessions.engine_session(session_id)}/{pane}"))
        return panes[pane]

    def messages(self, session_id: str, pane: str) -> list[dict]:
        return [m.to_dict() for m in self.pane(session_id, pane).conversation.messages]

    def seed(self, session_id: str, pane: str, messages: list[dict]) -> None:
        """Start a pane's conversation from a preset history (text chosen by the server)."""
        p = self.pane(session_id, pane)
        if p.inflight is not None:
            raise InvalidRequest("a reply is still streaming in this pane; stop it first", "pane")
        p.conversation.messages = [Message(m["role"], m["content"]) for m in messages]

    def clear(self, session_id: str, pane: str) -> None:
        self.cancel(session_id, pane)
        self.pane(session_id, pane).conversation.clear()

    def cancel(self, session_id: str, pane: str) -> bool:
        handle = self.pane(session_id, pane).inflight
        if handle is None:
            return False
        handle.cancel()
        return True

    def replies(self, session_id: str, pane: str | None = None) -> list[Reply]:
        return [r for r in self.session(session_id).replies if pane is None or r.pane == pane]

    def reply(self, session_id: str, request_id: str) -> Reply:
        for r in reversed(self.session(session_id).replies):
            if r.request_id == request_id:
                return r
        raise InvalidRequest(f"no reply {request_id!r} in this session", "request_id")

    def token_ids(self, session_id: str, reply: Reply) -> list[int] | None:
        """The reply's token ids exactly as generated (its conversation keeps them), None if gone."""
        pane = self.pane(session_id, reply.pane)
        return next((m.token_ids for m in pane.conversation.messages if m.timeline is reply.timeline), None)

    def decoder(self):
        """A token id list → its text, through the default backend's tokenizer (None: it has none here)."""
        tok = getattr(next(iter(self.engines.values())), "tokenizer", None)
        return None if tok is None else (lambda ids: tok.decode(ids))

    def join_timing(self, session_id: str, request_id: str, raw: dict) -> Reply:
        """Join the browser's timestamps to the reply's Timeline (`timeline.client`)."""
        reply = self.reply(session_id, request_id)
        reply.timeline.client.clear()
        reply.timeline.client.update(records.join_client(reply.timeline.to_dict(), raw, reply.text))
        return reply

    # --- one turn ----------------------------------------------------------------------------
    async def run_turn(self, session_id: str, pane: str, message: str | None, settings: PaneSettings | dict | None, *,
                       regenerate: bool = False, timeline: Timeline | None = None, source=None,
                       max_new_tokens: int | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Stream one reply as (event, data) pairs: start, status*, chunk*, then done or error.

        `settings`: the pane's, read (or as the page sends them: read here, once). Bad input raises
        InvalidRequest before anything streams. `source`, `max_new_tokens`: the stress run's paced source
        and its reply's length instead of the backend's (ui/chat/stress.py). Stopping (`cancel`) ends the
        stream with a normal `done` whose finish_reason is "cancelled"; the partial reply stays
        in the conversation. A consumer that goes away cancels the request.
        """
        timeline = timeline or Timeline()  # "received": as early as the caller could stamp it
        state = self.pane(session_id, pane)
        if state.inflight is not None:
            raise InvalidRequest("a reply is still streaming in this pane; stop it or wait", "message")
        if not isinstance(settings, PaneSettings):
            settings = PaneSettings.read(settings, list(self.engines))
        backend, engine = self.engine(settings.backend)
        system, config = settings.system, settings.config
        if source is not None:
            backend, engine = "stress (paced test source)", source
            config = replace(config, max_new_tokens=max_new_tokens or config.max_new_tokens)
        # The conversation changes only when a reply is done: a failed or abandoned turn loses nothing.
        history = list(state.conversation.messages)
        if regenerate:
            if history and history[-1].role == "assistant":
                history.pop()
            if not history or history[-1].role != "user":
                raise InvalidRequest("nothing to regenerate yet: send a message first", "message")
            message = history.pop().content
        elif not isinstance(message, str) or not message.strip():
            raise InvalidRequest("write a message first", "message")
        prompt = ([{"role": "system", "content": system}] if system else []) + [m.to_dict() for m in history] + [
            {"role": "user", "content": message}]
        handle = engine.submit(prompt, config, session=state.conversation.session, timeline=timeline)
        state.inflight = handle
        applied = {**settings.applied(), "backend": backend}
        reply = Reply(request_id=handle.id, session=session_id, pane=pane,
                      turn=sum(m.role == "user" for m in history) + 1, settings=applied, prompt=message,
                      timeline=handle.timeline)
        seen, parts = 0, []
        try:
            yield "start", {"request_id": handle.id, "pane": pane, "turn": reply.turn,
                            "received_ns": timeline.received_ns, "config": records.config_label(applied)}
            async for event in handle.aevents():
                if event.kind == "status":
                    yield "status", {"stage": event.stage, "events_ms": _events_ms(timeline),
                                     **{k: v for k, v in event.detail.items() if isinstance(v, (int, float, str))}}
                elif event.kind == "chunk":
                    new = timeline.token_ns[seen:event.output_tokens]
                    seen = event.output_tokens
                    parts.append(event.text)
                    yield "chunk", {"text": event.text, "n": event.output_tokens,
                                    "token_ms": [(t - timeline.received_ns) / 1e6 for t in new],
                                    # a reply that opens with a thought: the page folds it away by these offsets
                                    "marks": handle.thought_offsets, "events_ms": _thought_ms(timeline)}
                elif event.kind == "done":
                    state.inflight = None  # before the last yield: the consumer may stop reading here
                    reply.text = event.text  # its weights' bytes are on its Timeline (the variant that served it)
                    state.conversation.messages = history + [Message("user", message)]
                    state.conversation.add_reply(event)  # exactly as generated, token ids included
                    self._keep(session_id, reply)
                    record = reply.record()
                    yield "done", {"record": record, "row": records.row(record)}
                else:  # error: the conversation is unchanged, so nothing is lost
                    state.inflight = None
                    yield "error", {"message": event.detail.get("message", "the request failed"),
                                    "param": event.detail.get("param"), "request_id": handle.id}
        finally:
            if state.inflight is handle:
                state.inflight = None
            if handle.final is None:  # the consumer left mid-stream: free the worker
                handle.cancel()

    def _keep(self, session_id: str, reply: Reply) -> None:
        replies = self.session(session_id).replies
        replies.append(reply)
        del replies[: max(0, len(replies) - self.max_replies)]


def _thought_ms(tl: Timeline) -> dict:
    """The thought's instants stamped so far, as ms after `received` (the live thought band)."""
    return {name: (t - tl.received_ns) / 1e6 for name, t in (
        ("thought_first", tl.thought_first_ns), ("thought_end", tl.thought_end_ns),
        ("answer_first", tl.answer_first_ns)) if t is not None}


def _events_ms(tl: Timeline) -> dict:
    """The server stages stamped so far, as ms after `received` (for the live waterfall)."""
    return {name: (t - tl.received_ns) / 1e6 for name, t in (
        ("enqueued", tl.enqueued_ns), ("started", tl.started_ns), ("setup_done", tl.setup_done_ns),
        ("prefill_start", tl.prefill_start_ns)) if t is not None}
