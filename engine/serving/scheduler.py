"""Continuous batching: the worker thread runs up to `max_batch` requests at once (`--max-batch`).

Each request is still one `generate` generator with its own Timeline, sampler, KV cache and
prefix-cache lease; what changes is who drives it. The scheduler loop, between decode steps:

1. admits queued requests while fewer than `max_batch` run (queue_ms ends here);
2. advances each newcomer through setup (prompt ids, prefix-cache lookup);
3. runs one forward (engine/model/batch_forward.py) for every sequence waiting: the running batch's
   decode tokens and the newcomers' prompts (a long one 256 tokens per loop,
   `BatchedDecoding.interleave_chunk`) together, so a prefill does not stall the batch with a
   forward of its own; one forward per model variant (a quantized variant batches with its own
   kind). Each sequence gets its logits row and is resumed: it samples with its own generator, applies its own stop rules, streams
   its chunk and either waits for the next step or finishes, freeing its slot and its KV (or
   handing the KV to the prefix cache) on its own.

Unbatched: speculative requests (their step is a draft + verify of several tokens), requests
with the compiled step (its graph steps one sequence) and models without our Llama forward run beside the batch, one step of theirs per loop; their Timeline says
`batching: unbatched (...)`. Cancellation is what it always was: the generator checks its handle
before every step. With `max_batch` 1 the engine uses `Worker` (worker.py), not this.
A request in a batch scope (`Worker.open_batch_scope`, the page's Load tab) is admitted only while
fewer than its scope's limit of that scope run; requests behind it may go first meanwhile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from engine.core.errors import LatencyLabError
from engine.core.request import Event, RequestHandle
from engine.core.timeline import now_ns
from engine.model import batch_forward
from engine.model.fast_llama import packed_bytes
from engine.serving.decoding import Decoding
from engine.serving.generate import generate
from engine.serving.worker import Worker

log = logging.getLogger(__name__)
INTERLEAVE_CHUNK = 256  # prompt tokens of one batched newcomer per forward (a longer prompt takes several loops)


class BatchedDecoding(Decoding):
    """A Decoding whose decode steps the scheduler runs batched: `step` samples from the logits
    the batched forward left in `logits` instead of running the model itself."""

    batched = True
    interleave_chunk = INTERLEAVE_CHUNK

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_size = 1  # sequences in the forward that made the latest token (prefill: itself)
        self.batch_prompt_tokens = 0  # prompt tokens (anyone's prefill) in that forward
        self.logits = None

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.prompt_len

    def next_rows(self) -> list[int]:
        """The tokens this sequence feeds to the next forward: a prompt chunk, else its last token."""
        if self.prefilling:
            return self.ids[self.prefilled : min(self.prefilled + self.interleave_chunk, self.prompt_len)]
        return self.ids[-1:]

    def ran(self, rows: int, logits, batch_size: int, prompt_tokens: int = 0) -> None:
        """The scheduler's forward ran `rows` of next_rows() beside others (`batch_size` sequences,
        `prompt_tokens` prompt rows in all); keep what prefill() or step() will sample from."""
        self.batch_size, self.batch_prompt_tokens = batch_size, prompt_tokens
        if self.prefilling:
            self.prefilled += rows
            self.forward_passes += 1
            self._prefill_logits = logits if not self.prefilling else None
        else:
            self.logits = logits

    def prefill_chunks(self, chunk_tokens: int):
        """The request's own chunked-prefill toggle: its chunks run alone, outside the batch."""
        before = self.prefilled
        for end in super().prefill_chunks(chunk_tokens):
            self.batch_size, self.batch_prompt_tokens, before = 1, end - before, end
            yield end

    def step(self) -> list[int]:
        logits, self.logits = self.logits, None
        if logits is None:
            raise RuntimeError("a batched sequence stepped without the scheduler's forward")
        self.forward_passes += 1
        return self._accept([self.sampler.sample(logits)])


def _is_batched(factory) -> bool:
    return isinstance(factory, type) and issubclass(factory, BatchedDecoding)


@dataclass(eq=False)
class Sequence:
    handle: RequestHandle
    gen: object = None  # the request's generate() generator
    variant: object = None
    batched: bool = False
    waiting: Decoding | None = None  # set while parked at a decode step
    done: bool = False
    why_unbatched: str | None = None


@dataclass
class Stats:
    steps: int = 0  # batched forwards run
    rows: int = 0  # sequences they decoded together
    max_rows: int = 0
    unbatched_requests: int = 0
    histogram: dict = field(default_factory=dict)  # batch size -> steps


class BatchingWorker(Worker):
    """Worker whose thread runs up to `max_batch` requests at once, decode steps batched."""

    def __init__(self, loaded, max_batch: int, **kwargs):
        self.max_batch = max_batch
        self._active: list[Sequence] = []
        self.stats = Stats()
        if batch_forward.supports(loaded.model):
            batch_forward.pack(loaded.model)  # the default variant: now, not in the first step
        super().__init__(loaded, **kwargs)

    # --- the queue's view --------------------------------------------------------------------
    def _running_count(self) -> int:
        return len(self._active)

    @property
    def busy(self) -> bool:
        return bool(self._active)

    def batching_info(self) -> dict:
        s = self.stats
        return {
            "max_batch": self.max_batch,
            "mode": "continuous",
            "running": len(self._active),
            "batched_steps": s.steps,
            "mean_batch_size": round(s.rows / s.steps, 2) if s.steps else None,
            "max_batch_size_seen": s.max_rows,
            "batch_size_histogram": dict(sorted(s.histogram.items())),
            "unbatched_requests": s.unbatched_requests,
            "unbatched": "speculative requests, compiled steps and models without our Llama forward run beside the batch, "
                         "one step per scheduler loop",
            "packed_mb": round(packed_bytes() / 1e6, 1),
            "exact": "fp32 on CPU: a request's tokens are the same batched and alone (our fp32 kernel, or oneDNN "
                     "packed matmuls where it does not build)",
            "interleave_chunk": INTERLEAVE_CHUNK,
        }

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            active = list(self._active)
        for seq in active:
            seq.handle.cancel()
        super().close(timeout)

    # --- the worker thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            admitted = self._admit()
            if admitted is None:
                return
            for seq in admitted:
                self._start(seq)
            for seq in [s for s in self._active if s.waiting is None and not s.done]:
                self._advance(seq)  # newcomers: setup, prefill (a chunk); unbatched ones: one step
            self._step_batches()
            with self._cv:
                self._active = [s for s in self._active if not s.done]

    def _admit(self) -> list[Sequence] | None:
        """Take queued requests while there is room; wait when there is nothing at all to do.
        None: the worker is stopping and nothing runs any more."""
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
        for position, behind in enumerate(waiting, start=len(self._active)):
            behind.push(Event("status", stage="queued", detail={"position": position}))
        return admitted

    def _scope_has_room(self, handle: RequestHandle) -> bool:
        """Under the lock: whether a request's batch scope (open_batch_scope) runs fewer than its limit."""
        scope = handle.request.batch_scope
        limit = self._scopes.get(scope) if scope is not None else None
        if limit is None:
            return True
        return sum(s.handle.request.batch_scope == scope for s in self._active) < limit

    def _start(self, seq: Sequence) -> None:
        handle, tl = seq.handle, seq.handle.timeline
        tl.mark("started")
        if handle.cancelled:  # cancelled while it waited: never touches the model
            tl.finish_reason = "cancelled"
            tl.mark("done")
            handle.push(Event("done", detail={"finish_reason": "cancelled"}, timeline=tl))
            seq.done = True
            return
        try:
            seq.variant = self._variant(handle.request.config.quantization, tl)
        except Exception as exc:
            self._fail(seq, exc)
            return
        lm = seq.variant.loaded
        cfg = handle.request.config
        if cfg.speculative != "off":
            seq.why_unbatched = "speculative"
        elif cfg.compiled_decode:
            seq.why_unbatched = "compiled step"  # its graph is a one-sequence step
        elif not batch_forward.supports(lm.model):
            seq.why_unbatched = "model without the batched forward"
        custom = self.decoding_factory  # tests inject one; a BatchedDecoding subclass still batches
        seq.batched = seq.why_unbatched is None and (custom is None or _is_batched(custom))
        if seq.batched:
            batch_forward.pack(lm.model)  # a no-op once packed
            factory = custom or BatchedDecoding
        else:
            factory = self.decoding_factory
            self.stats.unbatched_requests += 1
        tl.counters["batching"] = "batched" if seq.batched else f"unbatched ({seq.why_unbatched or 'custom decoding'})"
        tl.counters["max_batch"] = self.max_batch
        kwargs = {"decoding_factory": factory} if factory else {}
        seq.gen = generate(lm.model, lm.tokenizer, lm.eos_token_ids, handle.request, tl,
                           should_stop=lambda: handle.cancelled, draft=getattr(lm, "draft", None),
                           prefix_cache=self.prefix_cache, **kwargs)

    def _advance(self, seq: Sequence) -> None:
        """Run the request's generator to its next pause: a decode step it waits for (batched),
        a prefill chunk done, one chunk of an unbatched request, or its end."""
        tl = seq.handle.timeline
        try:
            while True:
                event = next(seq.gen)
                if event.kind == "step":
                    seq.waiting = event.decoding
                    return
                if event.kind == "pause":
                    return
                if event.kind == "done":
                    if not seq.batched:  # each of its tokens came from a forward of its own
                        tl.batch_size = [1] * tl.output_tokens
                        tl.batch_prompt_tokens = [tl.prefill_tokens or 0] + [0] * (tl.output_tokens - 1) \
                            if tl.output_tokens else []  # its own prompt, in the forward of its first token
                    self._annotate(tl, seq.variant, seq.handle.request.config)
                    self.completed += 1
                    self.variants.record(seq.variant.name, tl)
                seq.handle.push(event)
                if event.kind == "done":
                    seq.done = True
                    seq.gen.close()
                    return
                if event.kind == "chunk" and not seq.batched:
                    return
        except StopIteration:
            seq.done = True
        except Exception as exc:  # the request fails alone; the others and the worker live on
            self._fail(seq, exc)

    def _step_batches(self) -> None:
        groups: dict[int, list[Sequence]] = {}
        for seq in self._active:
            if seq.waiting is not None and not seq.done:
                groups.setdefault(id(seq.waiting.model), []).append(seq)
        for seqs in groups.values():
            decs = [s.waiting for s in seqs]
            for start in range(0, len(decs), self.max_batch):
                self._forward(seqs[start : start + self.max_batch], decs[start : start + self.max_batch])

    def _forward(self, seqs: list[Sequence], decs: list[BatchedDecoding]) -> None:
        rows = [d.next_rows() for d in decs]
        try:
            logits = batch_forward.forward_batch(decs[0].model, rows, [d.cache for d in decs])
        except Exception as exc:  # a failed batched forward fails the requests in it, not the worker
            for seq in seqs:
                self._fail(seq, exc)
            return
        if decs[0].device.type == "cuda":
            import torch

            torch.cuda.synchronize(decs[0].device)
        B = len(decs)
        prompt_tokens = sum(len(r) for r, d in zip(rows, decs) if d.prefilling)  # newcomers' prompt rows
        s = self.stats
        s.steps += 1
        s.rows += B
        s.max_rows = max(s.max_rows, B)
        s.histogram[B] = s.histogram.get(B, 0) + 1
        for i, (seq, dec) in enumerate(zip(seqs, decs)):
            dec.ran(len(rows[i]), logits[i : i + 1], B, prompt_tokens)
            seq.waiting = None
            self._advance(seq)

    def _fail(self, seq: Sequence, exc: Exception) -> None:
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
