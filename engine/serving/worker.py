"""The one thread that owns the model, the FIFO queue in front of it, and the loop that runs it.

`Worker.submit` checks what only the engine knows (the weights variant, the batch scope; a config
is valid from its construction, engine/core/config.py), stamps it enqueued and returns a `RequestHandle` at once. The worker thread runs up to
`max_batch` requests at once in arrival order (`--max-batch`; 1: one at a time), their decode steps
batched into one forward (engine/serving/scheduler.py). A handle yields the request's events (sync
or async), can be cancelled (checked before every decode step), and stamps each chunk's hand-off to
the transport on the Timeline when its consumer asks for the next event. A request that fails, for
any reason, ends with an error event; the others and the worker keep going.
A request in a batch scope (`open_batch_scope`, the page's Load tab) is admitted only while fewer
than its scope's limit of that scope run; requests behind it may go first meanwhile.
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
from engine.serving import public_prefix, scheduler, work
from engine.serving.decoding import Pause, Step
from engine.serving.generate import generate
from engine.serving.scheduler import BatchedDecoding, Sequence, Stats
from engine.speculative import calibrate_idle

log = logging.getLogger(__name__)
_ids = itertools.count(1)


class Worker:
    """Runs up to `max_batch` requests at once on a thread of its own, in arrival order."""

    def __init__(self, loaded, max_batch: int = 1, max_queue: int | None = None, decoding_factory=None,
                 prefix_cache=None, variants=None):
        from engine.serving.variants import VariantSet

        self.loaded = loaded
        self.max_batch = max_batch  # requests running at once; 1: one at a time, each stepping alone
        self.prefix_cache = prefix_cache  # KV reuse across requests (None: every prompt is prefilled)
        self.variants = variants if variants is not None else VariantSet(loaded)  # per-request quantization
        self.max_queue = max_queue
        self.on_done: list = []  # fn(timeline, variant), called as a reply finishes (Engine.on_done: the publishers)
        self.on_idle: list = []  # fn() -> whether it did work, the measuring tools' idle work (Engine.on_idle)
        self.decoding_factory = decoding_factory  # tests inject one; a BatchedDecoding subclass still batches
        self.stats = Stats()
        self.completed = 0
        self.failed = 0
        self._queue: deque[RequestHandle] = deque()
        self._active: list[Sequence] = []  # running, in admission order (only the worker thread changes it)
        self._cv = threading.Condition()
        self._stopping = False
        self._scopes: dict[str, int] = {}  # batch scope id -> its run's limit (open_batch_scope)
        self._thread = threading.Thread(target=self._loop, name="model-worker", daemon=True)
        self._thread.start()

    @property
    def batching(self) -> bool:
        """Whether sequences can share a forward (max batch above 1)."""
        return self.max_batch > 1

    def submit(self, request: Request, timeline: Timeline | None = None) -> RequestHandle:
        """Queue a request. Bad options raise InvalidRequest here, before it waits in line."""
        self.variants.check(request.config.quantization)
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
            timeline.queue_position = len(self._queue) + len(self._active)
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
        sessions' chats. The limit is 1 to the engine's own max batch."""
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
        """Requests ahead of this one (the running ones included); None once it has started."""
        with self._cv:
            if handle in self._queue:
                return self._queue.index(handle) + len(self._active)
        return None

    @property
    def busy(self) -> bool:
        return bool(self._active)

    def running(self) -> int:
        """Requests admitted and not yet finished (up to max_batch)."""
        with self._cv:
            return sum(not s.done for s in self._active)

    def batching_info(self) -> dict | None:
        """The engine info's `batching` entry (None at max batch 1: nothing is batched)."""
        return self.stats.info(self.max_batch, len(self._active)) if self.batching else None

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            pending = list(self._queue)
            self._queue.clear()
            active = list(self._active)
            self._cv.notify_all()
        for handle in pending:
            handle.push(Event("error", detail={"message": "the server is shutting down", "type": "shutdown"},
                              timeline=handle.timeline))
        for seq in active:
            seq.handle.cancel()
        self._thread.join(timeout)

    # --- the worker thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while (admitted := self._admit()) is not None:
            for seq in admitted:
                self._start(seq)
            for seq in [s for s in self._active if s.waiting is None and not s.done]:
                self._advance(seq)  # newcomers: setup, prefill (a chunk); unbatched ones: one step
            for group in scheduler.waiting_groups(self._active, self.max_batch):
                try:
                    scheduler.forward(group, self.stats)
                except Exception as exc:  # a failed batched forward fails the requests in it, not the worker
                    for seq in group:
                        self._fail(seq, exc)
                    continue
                for seq in group:
                    seq.waiting = None
                    self._advance(seq)
            with self._cv:
                self._active = [s for s in self._active if not s.done]

    def _admit(self) -> list[Sequence] | None:
        """Take queued requests while there is room; wait (doing idle work) when there is nothing
        at all to do. None: the worker is stopping and nothing runs any more."""
        with self._cv:
            while not self._queue and not self._active and not self._stopping:
                if not self._idle_work() and not self._queue and not self._stopping:
                    self._cv.wait()  # re-checked: a request may have come while the lock was released
            if self._stopping:
                if not self._active:
                    return None
                for seq in self._active:
                    seq.handle.cancel()
            admitted, held = [], []
            while self._queue and len(self._active) < self.max_batch and not self._stopping:
                handle = self._queue.popleft()
                if not self._scope_has_room(handle):  # its run is at its own limit: later ones may go first
                    held.append(handle)
                    continue
                seq = Sequence(handle)
                self._active.append(seq)
                admitted.append(seq)
            self._queue.extendleft(reversed(held))  # back in front, in arrival order
            waiting = list(self._queue) if admitted else []
        for position, behind in enumerate(waiting, start=len(self._active)):  # everyone waiting moved up
            behind.push(Event("status", stage="queued", detail={"position": position}))
        return admitted

    def _scope_has_room(self, handle: RequestHandle) -> bool:
        """Under the lock: whether a request's batch scope (open_batch_scope) runs fewer than its limit."""
        scope = handle.request.batch_scope
        limit = self._scopes.get(scope) if scope is not None else None
        if limit is None:
            return True
        return sum(s.handle.request.batch_scope == scope for s in self._active) < limit

    def _idle_work(self) -> bool:
        """Under the lock, with nothing queued or running: one piece of deferred work, with the lock
        released meanwhile (requests can queue). Returns whether it did some (False: nothing left).
        The work: the public preamble's KV for each resident variant (public_prefix.py), the cost
        calibration of speculative decoding (it gives way to a request within one round of
        forwards), the idle work registered above the runtime (`on_idle`), then deferred variant quality."""
        self._cv.release()
        try:
            resident = self.variants.resident()
            if public_prefix.warm_idle(self.prefix_cache, resident):
                return True
            targets = [(v.runner, getattr(v.loaded, "draft", None)) for v in resident]
            if calibrate_idle(targets, should_stop=lambda: bool(self._queue) or self._stopping):
                return True
            if any(fn() for fn in self.on_idle):  # e.g. re-probing a machine limit a reply exceeded
                return True
            return self.variants.defer_quality and self.variants.measure_pending()
        except Exception:  # a failed measurement leaves its figure unknown (None), never the worker down
            log.exception("idle measurement failed")
            return True  # what failed is marked done: look for the next piece
        finally:
            self._cv.acquire()

    def _start(self, seq: Sequence) -> None:
        """An admitted request: its variant, its Decoding (batched or alone), its generator."""
        handle, tl = seq.handle, seq.handle.timeline
        tl.mark("started")
        if handle.cancelled:  # cancelled while it waited: never touches the model
            tl.finish_reason = "cancelled"
            tl.mark("done")
            seq.done = True  # before the push: whoever the done event wakes sees it finished (running())
            handle.push(Event("done", detail={"finish_reason": "cancelled"}, timeline=tl))
            return
        try:
            seq.variant = self._variant(handle.request.config.quantization, tl)
        except Exception as exc:
            self._fail(seq, exc)
            return
        lm, runner = seq.variant.loaded, seq.variant.runner
        factory = self.decoding_factory  # None: generate's Decoding
        if self.batching:
            why = scheduler.why_unbatched(handle.request.config, runner)
            seq.batched = why is None and (factory is None or scheduler.is_batched(factory))
            if seq.batched:
                factory = factory or BatchedDecoding
            else:
                self.stats.unbatched_requests += 1
            tl.counters.batching = "batched" if seq.batched else f"unbatched ({why or 'custom decoding'})"
            tl.counters.max_batch = self.max_batch
        kwargs = {"decoding_factory": factory} if factory else {}
        seq.gen = generate(runner, lm.tokenizer, lm.eos_token_ids, handle.request, tl,
                           should_stop=lambda: handle.cancelled, draft=getattr(lm, "draft", None),
                           prefix_cache=self.prefix_cache, **kwargs)

    def _advance(self, seq: Sequence) -> None:
        """Run the request's generator to its next pause: a Step it waits at (batched), a prefill
        chunk done, one chunk of a sequence that steps alone, or its end."""
        tl = seq.handle.timeline
        try:
            while True:
                event = next(seq.gen)
                if isinstance(event, Step):
                    seq.waiting = event.decoding
                    return
                if isinstance(event, Pause):
                    return
                if event.kind == "done":
                    if self.batching and not seq.batched:  # each of its tokens came from a forward of its own
                        tl.batch_size = [1] * tl.output_tokens
                        tl.batch_prompt_tokens = [tl.prefill_tokens or 0] + [0] * (tl.output_tokens - 1) \
                            if tl.output_tokens else []  # its own prompt, in the forward of its first token
                    plan = seq.variant.runner.plan  # the work it did, counted, and the matmul roof its prefill ran under
                    roof = plan.roof(tl.prefill_tokens or 1) or getattr(seq.variant.loaded, "dtype_name", None)
                    work.record(tl, seq.variant.loaded.model, seq.variant.weight_bytes, roof, seq.handle.request.config)
                    mode = "compiled" if tl.counters.decode_step == "compiled" else "eager"  # what served it
                    tl.counters.kernels = plan.for_reply(tl.prefill_tokens or 1, mode)
                    self._publish(tl, seq.variant)
                    self.completed += 1
                    self.variants.record(seq.variant.name, tl)
                if event.kind == "done":
                    seq.done = True  # before the push, as above
                seq.handle.push(event)
                if event.kind == "done":
                    seq.gen.close()
                    return
                if event.kind == "chunk" and not seq.batched:
                    return
        except StopIteration:
            seq.done = True
        except Exception as exc:  # the request fails alone; the others and the worker live on
            self._fail(seq, exc)

    def _publish(self, tl: Timeline, variant) -> None:
        """The publishers registered above the runtime (engine/lab.py: the machine's limits) stamp the
        finished reply before its done event goes out; one that fails is logged, the reply goes out."""
        for publish in self.on_done:
            try:
                publish(tl, variant)
            except Exception:  # noqa: BLE001 - a measuring tool must not fail a reply
                log.exception("a done publisher failed; the reply goes out without its figures")

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        """The request ends with an error event; its generator is closed (its lease released)."""
        self.failed += 1
        seq.done = True
        tl = seq.handle.timeline
        if seq.gen is not None:
            try:
                seq.gen.close()  # its finally releases the prefix-cache lease
            except Exception:  # noqa: BLE001 - closing a broken generator must not hide the first error
                pass
        tl.finish_reason = "error"
        tl.done_ns = tl.done_ns or now_ns()
        user_error = isinstance(exc, LatencyLabError)
        if not user_error:
            log.exception("request %s failed", seq.handle.id, exc_info=exc)
        seq.handle.push(Event("error", timeline=tl, detail={
            "message": str(exc) if user_error else f"internal error: {type(exc).__name__}: {exc}",
            "type": type(exc).__name__,
            "param": getattr(exc, "param", None),
            "user_error": user_error,
            "exception": exc,
        }))

    def _variant(self, name, tl: Timeline):
        """The model variant the request asked for; building one here counts in its setup_ms."""
        t0, resident = now_ns(), self.variants.is_resident(name)
        variant = self.variants.get(name)
        tl.counters.quantization = variant.name
        tl.context_max = getattr(variant.loaded, "max_context", None)
        if not resident:
            tl.counters.variant_build_ms = round((now_ns() - t0) / 1e6, 1)
        return variant
