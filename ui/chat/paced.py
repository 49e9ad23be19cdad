"""A paced test source: no model, tokens at an exact rate. For measuring the page, not the model.

It has the `Engine` interface the page uses (`submit`, `complete`, `info`, `close`) and records a real
Timeline, so the transport and the page can be tested at token rates no model here reaches
(`python app.py --paced-source 400`; the page header says it is a test source). With a `trace`
it replays recorded chunks instead ([ms since the request started, text, tokens so far], e.g. a
speculative reply's bursts); with chunked prefill on it reports prefill progress like the engine.
`words`: the tokens it repeats (ui/chat/stress.py: the stress run's long reply). With `think` its reply opens with a scripted `<think>` block (THINK), as a thinking model's does.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

from engine.core.info import EngineInfo
from engine.core.request import Event, Request, RequestHandle
from engine.core.timeline import Timeline, now_ns

_ids = itertools.count(1)
WORDS = ("the", "page", "keeps", "up", "with", "a", "fast", "stream", "of", "short", "tokens", "and")
# markdown=True: a reply that exercises the page's markdown renderer (paragraphs, marks, lists, code)
MARKDOWN = ("**Steps**", " to", " *measure*", ":\n\n", "1.", " Run", " `python", " -m", " ui.bench`", "\n",
            "2.", " Read", " the", " **p50**", "\n\n", "```py", "\nfor", " x", " in", " range(3):", "\n",
            "    print(x)", "\n```", "\n\n", "The", " page", " keeps", " up", " with", " a", " _fast_",
            " stream", ".", "\n\n")
THINK = ("<think>", "\n", "The", " user", " wants", " a", " short", " reply", ";", " keep", " it", " brief", ".",
         "\n", "</think>", "\n\n")


class PacedSource:
    def __init__(self, tokens_per_s: float = 200.0, prefill_ms: float = 20.0, trace: list | None = None,
                 markdown: bool = False, think: bool = False, words: tuple | None = None):
        if tokens_per_s <= 0:
            raise ValueError("tokens_per_s must be positive")
        self.tokens_per_s = tokens_per_s
        self.prefill_ms = prefill_ms
        self.trace = trace
        self.words = words or (MARKDOWN if markdown else tuple(w + " " for w in WORDS))  # words: its own reply
        self.opening = THINK if think else ()
        self._queue: queue.SimpleQueue[RequestHandle | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="paced-source", daemon=True)
        self._thread.start()

    def info(self) -> EngineInfo:
        what = "a recorded trace" if self.trace else f"{self.tokens_per_s:g} tok/s"
        return EngineInfo(name=f"paced test source ({what}, no model)", source="paced",
                          notes=("no model: tokens are emitted at a set pace to measure the page itself",))

    def submit(self, messages=None, config=None, *, prompt_ids=None, session=None, timeline=None):
        from engine.core.config import GenerationConfig

        request = Request(messages=messages, prompt_ids=prompt_ids, config=config or GenerationConfig(),
                          session=session, id=f"paced-{next(_ids)}")
        timeline = timeline or Timeline()
        timeline.request_id = request.id
        handle = RequestHandle(request, timeline)
        timeline.queue_position = self._queue.qsize()
        timeline.mark("enqueued")
        handle.push(Event("status", stage="queued", detail={"position": timeline.queue_position}))
        self._queue.put(handle)
        return handle

    def complete(self, messages: list[dict], config=None, **kw) -> Event:
        """Blocking, as Engine.complete: the done event. The Load tab's clients call this."""
        return self.submit(messages, config, **kw).result()

    def close(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while (handle := self._queue.get()) is not None:
            self._run(handle)

    def _run(self, handle: RequestHandle) -> None:
        tl, cfg = handle.timeline, handle.request.config
        tl.mark("started")
        chars = sum(len(m.get("content", "")) for m in handle.request.messages or [])
        tl.prompt_tokens = tl.prefill_tokens = max(1, chars // 4)
        tl.mark("setup_done")
        handle.push(Event("status", stage="prefill", detail={"prefill_tokens": tl.prefill_tokens}))
        tl.prefill_start_ns = now_ns()
        began = time.perf_counter()
        if cfg.chunked_prefill:  # progress as the engine reports it, chunks spread over prefill_ms
            chunks = -(-tl.prefill_tokens // cfg.prefill_chunk_tokens)
            for c in range(chunks + 1):
                _sleep_until(began + self.prefill_ms / 1e3 * c / chunks)
                done = min(c * cfg.prefill_chunk_tokens, tl.prefill_tokens)
                handle.push(Event("status", stage="prefill",
                                  detail={"prefill_tokens": tl.prefill_tokens, "prefilled_tokens": done}))
        parts, finish, produced = [], "length", 0
        for at_ms, text, tokens in self._chunks(cfg.max_new_tokens):
            _sleep_until(began + at_ms / 1e3)
            if handle.cancelled:
                finish = "cancelled"
                break
            tl.add_tokens(tokens - produced)
            ids, produced = list(range(produced, tokens)), tokens
            parts.append(text)
            handle.push(Event("chunk", text=text, token_ids=ids, output_tokens=produced))
        else:
            finish = "stop" if self.trace else "length"
        tl.finish_reason = finish
        tl.mark("done")
        handle.push(Event("done", text="".join(parts), token_ids=list(range(produced)), output_tokens=produced,
                          detail={"finish_reason": finish}, timeline=tl))

    def _chunks(self, max_tokens: int):
        """(ms after prefill began, text, tokens so far) of each chunk."""
        if self.trace:
            yield from ((t, text, n) for t, text, n in self.trace if n <= max_tokens)
            return
        k = len(self.opening)
        for i in range(max_tokens):
            text = self.opening[i] if i < k else self.words[(i - k) % len(self.words)]
            yield self.prefill_ms + 1e3 * i / self.tokens_per_s, text, i + 1


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
