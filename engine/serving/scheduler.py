"""Continuous batching's parts; the worker (engine/serving/worker.py) runs the loop that uses them.

Each request is one `generate` generator with its own Timeline, sampler, KV cache and prefix-cache
lease; what batching changes is who runs its forwards. The worker's loop, between decode steps:

1. admits queued requests while fewer than `max_batch` run (queue_ms ends here);
2. advances each newcomer through setup (prompt ids, prefix-cache lookup);
3. runs one forward (the variant's runner, engine/runtime/runner.py) for every sequence waiting at a
   `Step`: the running batch's decode tokens and the newcomers' prompts (a long one 256 tokens per
   loop, `BatchedDecoding.interleave_chunk`) together, so a prefill does not stall the batch with a
   forward of its own; one forward per model variant (a quantized variant batches with its own
   kind). Each sequence gets its logits row and is resumed: it samples with its own generator,
   applies its own stop rules, streams its chunk and either waits for the next step or finishes,
   freeing its slot and its KV (or handing the KV to the prefix cache) on its own.

Unbatched (`why_unbatched`): speculative requests (their step is a draft + verify of several
tokens), requests with the compiled step on CPU (Inductor's graph steps one sequence; on a GPU its CUDA
graphs step a batch of its own kind, engine/runtime/cuda_graph.py) and models without our Llama forward
run beside the batch, one step of theirs per loop; their Timeline says
`batching: unbatched (...)`. With `max_batch` 1 there is nothing to batch with: every request
steps its own Decoding, one at a time, and no batching figures are stamped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core import clock
from engine.core.request import RequestHandle
from engine.kernels.catalogue import packed_bytes
from engine.runtime.runner import Batch
from engine.serving.decoding import Decoding

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


def is_batched(factory) -> bool:
    """Whether a decoding factory (tests inject one) makes sequences the batched forward can run."""
    return isinstance(factory, type) and issubclass(factory, BatchedDecoding)


def why_unbatched(config, runner) -> str | None:
    """Why a request steps alone beside the batch (None: it can join the batched forward)."""
    if config.speculative != "off":
        return "speculative"
    if config.compiled_decode and runner.plan.compiled_mode == "inductor":
        return "compiled step"  # Inductor's graph steps one sequence; on a GPU CUDA graphs step a batch
    if runner.plan.runner != "fast":  # the batched forward is our Llama forward's
        return "model without the batched forward"
    return None


@dataclass(eq=False)
class Sequence:
    """A running request, as the worker's loop sees it."""

    handle: RequestHandle
    gen: object = None  # the request's generate() generator
    variant: object = None
    batched: bool = False
    waiting: Decoding | None = None  # set while parked at a Step
    done: bool = False


@dataclass
class Stats:
    steps: int = 0  # batched forwards run
    rows: int = 0  # sequences they decoded together
    max_rows: int = 0
    unbatched_requests: int = 0
    histogram: dict = field(default_factory=dict)  # batch size -> steps

    def info(self, max_batch: int, running: int) -> dict:
        """The engine info's `batching` entry."""
        return {
            "max_batch": max_batch,
            "mode": "continuous",
            "running": running,
            "batched_steps": self.steps,
            "mean_batch_size": round(self.rows / self.steps, 2) if self.steps else None,
            "max_batch_size_seen": self.max_rows,
            "batch_size_histogram": dict(sorted(self.histogram.items())),
            "unbatched_requests": self.unbatched_requests,
            "unbatched": "speculative requests, compiled steps and models without our Llama forward run beside the batch, "
                         "one step per scheduler loop",
            "packed_mb": round(packed_bytes() / 1e6, 1),
            "exact": "fp32 on CPU: a request's tokens are the same batched and alone (our fp32 kernel, or oneDNN "
                     "packed matmuls where it does not build)",
            "interleave_chunk": INTERLEAVE_CHUNK,
        }


def waiting_groups(active: list[Sequence], max_batch: int) -> list[list[Sequence]]:
    """The sequences parked at a Step, one group per model variant, at most `max_batch` a group."""
    by_model: dict[tuple, list[Sequence]] = {}
    for seq in active:  # a group shares one forward: the same runner, and graphs replayed or not
        if seq.waiting is not None and not seq.done:
            key = (id(seq.waiting.runner), seq.waiting.mode)
            by_model.setdefault(key, []).append(seq)
    return [seqs[i : i + max_batch] for seqs in by_model.values() for i in range(0, len(seqs), max_batch)]


def forward(seqs: list[Sequence], stats: Stats) -> None:
    """One batched forward for a group: each sequence's next rows in, its logits row handed over
    (`BatchedDecoding.ran`). Raises (before handing anything over) when the forward fails."""
    decs = [s.waiting for s in seqs]
    rows = [d.next_rows() for d in decs]
    logits = decs[0].runner.run(Batch(rows, [d.cache for d in decs], mode=decs[0].mode))

    clock.sync(decs[0].device)  # the tokens' stamps claim the step ran: wait for the device
    B = len(decs)
    prompt_tokens = sum(len(r) for r, d in zip(rows, decs) if d.prefilling)  # newcomers' prompt rows
    stats.steps += 1
    stats.rows += B
    stats.max_rows = max(stats.max_rows, B)
    stats.histogram[B] = stats.histogram.get(B, 0) + 1
    for i, dec in enumerate(decs):
        dec.ran(len(rows[i]), logits[i : i + 1], B, prompt_tokens)
