"""The engine's wire types, without torch: what a request is (`Request`), what it yields (`Event`),
the handle a caller holds while it runs (`RequestHandle`), and the one check of chat messages
(`validate_messages`): it makes the `Messages` a Request holds, so each request's messages are checked
once, where they enter (the API's body model, server/protocol.py; else when the Request is made).

The API, the page, the remote engine and the paced test source use these without importing the
decode loop; the worker (engine/serving/worker.py) produces them. Every chunk any engine pushes
passes `RequestHandle.push`, which stamps a reply's thought on its Timeline (engine/core/thinking.py).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from engine.core.config import GenerationConfig
from engine.core.errors import InvalidRequest, LatencyLabError
from engine.core.thinking import ThoughtClock
from engine.core.timeline import Timeline, now_ns


class Messages(list):
    """Chat messages that passed `validate_messages` (only it makes one): [{role, content}], checked."""


@dataclass
class Request:
    """What to answer: chat `messages` (rendered with the chat template) or ready `prompt_ids`.
    Messages not checked yet are checked when the Request is made (InvalidRequest, before any queue)."""

    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    config: GenerationConfig = field(default_factory=GenerationConfig)
    session: str | None = None  # prefix-cache scope (KV reuse); None: private to this request
    batch_scope: str | None = None  # a run-scoped batch limit (Worker.open_batch_scope); None: the engine's own
    id: str = ""

    def __post_init__(self):
        if self.prompt_ids is None and not isinstance(self.messages, Messages):
            self.messages = validate_messages(self.messages)


@dataclass
class Event:
    kind: str  # status | chunk | done | error
    text: str = ""  # chunk: the new text; done: the whole reply
    token_ids: list[int] = field(default_factory=list)  # chunk: new ids; done: all output ids
    output_tokens: int = 0  # tokens sampled so far
    stage: str = ""  # status: queued | setup | prefill | decode
    detail: dict = field(default_factory=dict)  # status/done/error specifics
    timeline: Timeline | None = None

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "text": self.text, "token_ids": list(self.token_ids),
             "output_tokens": self.output_tokens, "stage": self.stage, "detail": {k: v for k, v in self.detail.items() if k != "exception"}}
        if self.timeline is not None and self.kind in ("done", "error"):
            d["timeline"] = self.timeline.to_dict()
        return d


def validate_messages(messages) -> Messages:
    """The one check of chat messages: their shape, roles, Unicode, and a prompt that says something."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with a string 'content'", "messages")
        if m.get("role") not in ("system", "user", "assistant"):
            raise InvalidRequest(f"messages[{i}].role must be system, user or assistant", "messages")
        if not _is_unicode(m["content"]):
            raise InvalidRequest(f"messages[{i}].content is not valid Unicode (a lone surrogate such as \\ud800?)",
                                 "messages")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in out if m["role"] != "system"):
        raise InvalidRequest("the prompt is empty: write a message first", "messages")
    return Messages(out)


def _is_unicode(text: str) -> bool:
    """False for text a tokenizer cannot take: lone surrogates (JSON allows "\\ud800"; UTF-8 does not)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


class QueueFull(LatencyLabError):
    """The queue is at its bound; try again later (HTTP 429)."""


class RequestHandle:
    def __init__(self, request: Request, timeline: Timeline):
        self.request = request
        self.timeline = timeline
        self.id = request.id
        self._cancel = threading.Event()
        self._sync: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async: asyncio.Queue[Event] | None = None
        self.final: Event | None = None
        self._thought = ThoughtClock(timeline)  # every engine's chunks pass here: one detection

    @property
    def thought_offsets(self) -> dict:
        """Where the reply's opening thought begins and ends and its answer begins, as character offsets
        of its text found so far ({} while undecided; ThoughtClock.known)."""
        return self._thought.known()

    # --- producer side (worker thread) -----------------------------------------------------
    def push(self, event: Event) -> None:
        if event.kind == "chunk":
            self._thought.chunk(event.text, event.output_tokens, now_ns())
        elif event.kind in ("done", "error"):
            self._thought.finish(self.timeline.output_tokens)
            self.final = event
        with self._lock:
            if self._loop is None:
                self._sync.put(event)
                return
            loop, aq = self._loop, self._async
        try:
            loop.call_soon_threadsafe(aq.put_nowait, event)
        except RuntimeError:  # the consumer's event loop is gone: nobody is listening any more
            self.cancel()

    # --- consumer side --------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events until done/error. Each chunk counts as handed to the transport when the
        consumer comes back for the next event."""
        while True:
            event = self._sync.get(timeout=timeout)
            yield event
            self._after_yield(event)
            if event.kind in ("done", "error"):
                return

    async def aevents(self) -> AsyncIterator[Event]:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._async = asyncio.Queue()
            while True:  # events pushed before we attached
                try:
                    self._async.put_nowait(self._sync.get_nowait())
                except queue.Empty:
                    break
        while True:
            event = await self._async.get()
            yield event
            self._after_yield(event)
            if event.kind in ("done", "error"):
                return

    def _after_yield(self, event: Event) -> None:
        if event.kind == "chunk":
            self.timeline.add_chunk_out(event.output_tokens)

    def result(self, timeout: float | None = None) -> Event:
        """Wait for the end; return the done event, or raise the request's error."""
        for event in self.events(timeout=timeout):
            if event.kind == "error":
                raise event.detail.get("exception") or LatencyLabError(event.detail.get("message", "failed"))
        return self.final
