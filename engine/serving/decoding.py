"""`Decoding`: one sequence being generated (its token ids, KV cache and sampler), and the
length rules a request must fit (context window, cache room for a speculative verify pass).
`engine.serving.generate` drives a Decoding. Every forward goes through the variant's runner
(engine/runtime/runner.py), the compiled-step toggle as `Batch.mode`. A speculative request's step
asks its `Speculation` (engine/speculative) for guesses, has the runner verify them in one pass, and
gives it the logits to judge.

`Step` and `Pause` are what `generate` yields to the worker's scheduler (engine/serving/worker.py)
between the public events: they never reach a caller (engine.core.request.Event is the public type).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.core import clock
from engine.core.config import GenerationConfig
from engine.core.errors import ContextOverflow, InvalidRequest
from engine.runtime.runner import Batch
from engine.serving.sampling import Sampler
from engine.speculative import Speculation

SPECULATION_SLACK = 17  # spare cache room: a verify pass may write k+1 positions past the end


def check_lengths(prompt_tokens: int, config: GenerationConfig, max_context: int) -> None:
    if prompt_tokens == 0:
        raise InvalidRequest("the prompt is empty", "messages")
    if prompt_tokens >= max_context:
        raise ContextOverflow(
            f"the prompt has {prompt_tokens:,} tokens but the model's context window is {max_context:,}; "
            "shorten the conversation or start a new one",
            "messages",
        )
    room = max_context - prompt_tokens
    if config.max_new_tokens > room:
        raise ContextOverflow(
            f"max_new_tokens={config.max_new_tokens:,} does not fit: the prompt has {prompt_tokens:,} tokens "
            f"and the context window is {max_context:,}, so at most {room:,} new tokens fit",
            "max_new_tokens",
        )


def cache_capacity(prompt_tokens: int, config: GenerationConfig) -> int:
    """KV positions a request may need: prompt, output, and room for a speculative verify pass."""
    return prompt_tokens + config.max_new_tokens + SPECULATION_SLACK


@dataclass(frozen=True)
class Step:
    """A batched sequence waits for the scheduler's forward of its `next_rows()` (a prompt chunk or
    its last token); the scheduler hands it the logits (`BatchedDecoding.ran`) and resumes it."""

    decoding: Decoding


@dataclass(frozen=True)
class Pause:
    """A sequence ran one piece of work alone (a chunk of its chunked prefill): the scheduler lets
    the others have their forward before resuming it."""


class Decoding:
    """One sequence being generated: its ids, KV cache and sampler (and, for a speculative request,
    its `speculation`). `runner`: the variant's runner; `draft`: the loaded draft, for speculative='draft'."""

    batched = False  # True: its decode steps run in the scheduler's batched forward (engine/serving/scheduler.py)

    def __init__(self, runner, prompt_ids: list[int], config: GenerationConfig, cache=None, cached_tokens: int = 0,
                 draft=None):
        self.runner = runner
        self.model = runner.model  # the weights: the scheduler's and the prefix cache's key
        self.config = config
        self.mode = "compiled" if config.compiled_decode else "eager"  # the toggle, as the runner takes it
        self.device = runner.device
        self.prompt_len = len(prompt_ids)
        self.ids: list[int] = list(prompt_ids)  # prompt + output so far
        self.sampler = Sampler(config, self.device)
        capacity = cache_capacity(self.prompt_len, config)
        self.speculation = (Speculation(runner, config, self.prompt_len, capacity, draft)
                            if config.speculative != "off" else None)
        self.cache = cache if cache is not None else runner.new_cache(capacity, config.kv_cache_dtype)
        self.cache.ensure_capacity(capacity)
        # At least the last prompt token must run through the model to give the first logits.
        self.cached_tokens = min(cached_tokens, self.prompt_len - 1)
        if self.cache.length > self.cached_tokens:
            self.cache.crop(self.cached_tokens)
        self.forward_passes = 0
        self.prefilled = self.cached_tokens  # prompt tokens in the cache so far
        self._prefill_logits = None  # the last prefill chunk's logits, until prefill() samples them

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _run(self, ids, all_logits: bool = False) -> torch.Tensor:
        """This sequence's tokens `ids` through the runner (one forward pass)."""
        self.forward_passes += 1
        return self.runner.run(Batch([ids], [self.cache], all_logits, self.mode))

    def prefill_chunks(self, chunk_tokens: int) -> Iterator[int]:
        """Chunked prefill (as vLLM does it): run the uncached prompt `chunk_tokens` at a time and
        yield, after each chunk, how many prompt tokens are in the cache. Between chunks the
        caller can report progress or stop; `prefill()` then samples the first token."""
        while self.prefilled < self.prompt_len:
            end = min(self.prefilled + chunk_tokens, self.prompt_len)
            self._prefill_logits = self._run(self._tensor(self.ids[self.prefilled : end]))
            self.prefilled = end
            clock.sync(self.device)  # progress, like a token, must not run ahead of the device
            yield end

    def prefill(self) -> list[int]:
        """Run the prompt tokens not yet in the cache (all uncached ones, unless prefill_chunks
        ran); return the first output token."""
        if self.prefilled < self.prompt_len:
            self._prefill_logits = self._run(self._tensor(self.ids[self.prefilled : self.prompt_len]))
            self.prefilled = self.prompt_len
        logits, self._prefill_logits = self._prefill_logits, None
        return self._accept([self.sampler.sample(logits)])

    def step(self) -> list[int]:
        """One decode step: feed the last token, return the next (a speculative step: several)."""
        if self.speculation is None:
            return self._plain_step()
        room = max(0, min(self.config.max_new_tokens - len(self.output_ids) - 1,  # the bonus token always comes
                          self.runner.max_context - len(self.ids) - 1))
        proposal = self.speculation.propose(self.ids, room, self.sampler)
        if proposal is None:
            out = self._plain_step()
            self.speculation.plain(out)
            return out
        before, t0 = len(self.ids), clock.now_ns()
        logits = self._run(self._tensor([self.ids[-1], *proposal.tokens]), all_logits=True)
        new = self.speculation.verify(proposal, logits, self.sampler)
        spent = clock.done_ns(self.device) - t0
        self.cache.crop(before + len(new) - 1)  # keep the last committed token and the accepted guesses
        self.speculation.verified(proposal, new, before, len(self.output_ids), spent)
        return self._accept(new)

    def _plain_step(self) -> list[int]:
        logits = self._run(torch.tensor(self.ids[-1:]))  # on the host: a GPU's static step reads it there
        return self._accept([self.sampler.sample(logits)])

    def _accept(self, tokens: list[int]) -> list[int]:
        self.ids.extend(tokens)
        clock.sync(self.device)  # a timestamp that claims a token exists must follow the device
        return tokens

    def truncate(self, length: int) -> None:
        """Keep the first `length` ids (a multi-token step may run past EOS or a stop); the cache
        keeps KV for all but the last, as after any step."""
        del self.ids[length:]
        self.cache.crop(min(self.cache.length, max(length - 1, 0)))
        if self.speculation is not None:
            self.speculation.truncate(length)

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self.prompt_len :]
