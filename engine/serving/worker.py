"""The one thread that owns the model, and the FIFO queue in front of it.

`Worker.submit` validates a request, stamps it enqueued and returns a `RequestHandle` at once;
the worker thread runs requests one at a time in arrival order. A handle yields the request's
events (sync or async), can be cancelled (checked before every decode step), and stamps each
chunk's hand-off to the transport on the Timeline when its consumer asks for the next event.
A request that fails, for any reason, ends with an error event; the worker keeps serving.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections import deque

from engine.core.errors import InvalidRequest, LatencyLabError
from engine.core.request import Event, QueueFull, Request, RequestHandle
from engine.core.timeline import Timeline, now_ns
from engine.kernels import choose
from engine.measure import roofline
from engine.serving import public_prefix
from engine.serving.generate import generate
from engine.speculative import calibrate_idle

log = logging.getLogger(__name__)
_ids = itertools.count(1)


class Worker:
    """Runs requests one at a time on a thread of its own, in arrival order."""

    max_batch = 1  # requests running at once (BatchingWorker: --max-batch)

    def __init__(self, loaded, max_queue: int | None = None, decoding_factory=None, prefix_cache=None,
                 variants=None):
        from engine.quant.variants import VariantSet

        self.loaded = loaded
        self.prefix_cache = prefix_cache  # KV reuse across requests (None: every prompt is prefilled)
        self.variants = variants if variants is not None else VariantSet(loaded)  # per-request quantization
        self.max_queue = max_queue
        self.machine_limits = None  # engine.machine_limits.MachineLimits: the roofline's ceilings
        self.decoding_factory = decoding_factory
        self._queue: deque[RequestHandle] = deque()
        self._cv = threading.Condition()
        self._running: RequestHandle | None = None
        self._stopping = False
        self._scopes: dict[str, int] = {}  # batch scope id -> its run's limit (open_batch_scope)
        self.completed = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._loop, name="model-worker", daemon=True)
        self._thread.start()

    def submit(self, request: Request, timeline: Timeline | None = None) -> RequestHandle:
        """Queue a request. Bad options raise InvalidRequest here, before it waits in line."""
        request.config.validate()
        self.variants.check(request.config.quantization)
        if request.prompt_ids is None and request.messages is None:
            raise InvalidRequest("a request needs messages or prompt_ids", "messages")
        if request.batch_scope is not None and request.batch_scope not in self._scopes:
            raise InvalidRequest("unknown batch_scope: a scope exists only while the load run that opened it "
                                 "runs", "batch_scope")
        request.id = request.id or f"req-{next(_ids)}"
        timeline = timeline or Timeline()
        timeline.request_id = request.id
        handle = RequestHandle(request, timeline)
        with self._cv:
            if self._stopping:
                raise LatencyLabError("the worker is shutting down")
            if self.max_queue is not None and len(self._queue) >= self.max_queue:
                raise QueueFull(f"the server is busy: {self.max_queue} requests are already waiting, the most it "
                                "queues (--max-queue); try again shortly")
            timeline.queue_position = len(self._queue) + self._running_count()
            timeline.mark("enqueued")
            # Pushed under the lock, so it comes before any "moved up" update from the worker thread.
            handle.push(Event("status", stage="queued", detail={"position": timeline.queue_position}))
            self._queue.append(handle)
            self._cv.notify()
        return handle

    def open_batch_scope(self, limit: int) -> str:
        """A run-scoped batch limit: requests naming the returned id (`Request.batch_scope`) run at
        most `limit` at once, while everyone else's requests keep the engine's own limit. The page's
        Load tab compares max batch 1 and 8 this way on one running engine, without touching other
        sessions' chats. Here (one request at a time) only 1 can be asked for."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= self.max_batch:
            raise InvalidRequest(f"max batch must be 1 to {self.max_batch} on this engine (it was started with "
                                 f"--max-batch {self.max_batch}), not {limit!r}", "max_batch")
        scope = secrets.token_urlsafe(12)
        with self._cv:
            self._scopes[scope] = limit
        return scope

    def close_batch_scope(self, scope: str) -> None:
        with self._cv:
            self._scopes.pop(scope, None)
            self._cv.notify_all()

    def queue_depth(self) -> int:
        with self._cv:
            return len(self._queue)

    def position(self, handle: RequestHandle) -> int | None:
        """Requests ahead of this one (the running one included); None once it has started."""
        with self._cv:
            if handle in self._queue:
                return self._queue.index(handle) + self._running_count()
        return None

    def _running_count(self) -> int:
        """Requests running now (here 0 or 1; the batching worker runs several)."""
        return 1 if self._running else 0

    @property
    def busy(self) -> bool:
        return self._running is not None

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for handle in pending:
            handle.push(Event("error", detail={"message": "the server is shutting down", "type": "shutdown"},
                              timeline=handle.timeline))
        if self._running:
            self._running.cancel()
        self._thread.join(timeout)

    # --- the worker thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    if not self._idle_work() and not self._queue and not self._stopping:
                        self._cv.wait()  # re-checked: a request may have come while the lock was released
                if self._stopping:
                    return
                handle = self._queue.popleft()
                self._running = handle
                waiting = list(self._queue)
            for position, behind in enumerate(waiting, start=1):  # everyone waiting moved up one place
                behind.push(Event("status", stage="queued", detail={"position": position}))
            try:
                self._run(handle)
            finally:
                with self._cv:
                    self._running = None

    def _idle_work(self) -> bool:
        """Under the lock, with nothing queued or running: one piece of deferred work, with the lock
        released meanwhile (requests can queue). Returns whether it did some (False: nothing left).
        The work: the public preamble's KV for each resident variant (public_prefix.py), the cost
        calibration of speculative decoding (it gives way to a request within one round of
        forwards), then deferred variant quality."""
        self._cv.release()
        try:
            models = self.variants.resident_models()
            if public_prefix.warm_idle(self.prefix_cache, models):
                return True
            if calibrate_idle(models, should_stop=lambda: bool(self._queue) or self._stopping):
                return True
            return self.variants.defer_quality and self.variants.measure_pending()
        except Exception:  # a failed measurement leaves its figure unknown (None), never the worker down
            log.exception("idle measurement failed")
            return True  # what failed is marked done: look for the next piece
        finally:
            self._cv.acquire()

    def _run(self, handle: RequestHandle) -> None:
        tl = handle.timeline
        tl.mark("started")
        if handle.cancelled:  # cancelled while it waited: never touches the model
            tl.finish_reason = "cancelled"
            tl.mark("done")
            handle.push(Event("done", detail={"finish_reason": "cancelled"}, timeline=tl))
            return
        kwargs = {"decoding_factory": self.decoding_factory} if self.decoding_factory else {}
        kwargs["prefix_cache"] = self.prefix_cache
        try:
            variant = self._variant(handle.request.config.quantization, tl)
            lm = variant.loaded
            for event in generate(lm.model, lm.tokenizer, lm.eos_token_ids, handle.request, tl,
                                  should_stop=lambda: handle.cancelled, draft=getattr(lm, "draft", None), **kwargs):
                if event.kind == "done":
                    self._annotate(tl, variant, handle.request.config)
                handle.push(event)
            self.completed += 1
            self.variants.record(variant.name, tl)
        except Exception as exc:  # the request fails alone; the worker lives on
            self.failed += 1
            tl.finish_reason = "error"
            tl.done_ns = tl.done_ns or now_ns()
            user_error = isinstance(exc, LatencyLabError)
            if not user_error:
                log.exception("request %s failed", handle.id)
            handle.push(Event("error", timeline=tl, detail={
                "message": str(exc) if user_error else f"internal error: {type(exc).__name__}: {exc}",
                "type": type(exc).__name__,
                "param": getattr(exc, "param", None),
                "user_error": user_error,
                "exception": exc,
            }))

    def _annotate(self, tl: Timeline, variant, config) -> None:
        """The roofline's figures ride on the done event's timeline (both workers call this)."""
        lm = variant.loaded
        roofline.annotate(tl, lm.model, variant.weight_bytes, self.machine_limits, getattr(lm, "dtype_name", None),
                          config)
        compiled = tl.counters.get("decode_step") == "compiled"
        tl.counters["kernels"] = choose.for_reply(lm.model, tl.prefill_tokens or 1, compiled)  # which kernels served

    def _variant(self, name, tl: Timeline):
        """The model variant the request asked for; building one here counts in its setup_ms."""
        t0, resident = now_ns(), self.variants.is_resident(name)
        variant = self.variants.get(name)
        tl.counters["quantization"] = variant.name
        tl.context_max = getattr(variant.loaded, "max_context", None)
        if not resident:
            tl.counters["variant_build_ms"] = round((now_ns() - t0) / 1e6, 1)
        return variant
