"""`Decoding`: one sequence being generated (its token ids, KV cache and sampler), and the
length rules a request must fit (context window, cache room for a speculative verify pass).
`engine.serving.generate` drives a Decoding; `engine.speculative` extends it.

`Step` and `Pause` are what `generate` yields to the worker's scheduler (engine/serving/worker.py)
between the public events: they never reach a caller (engine.core.request.Event is the public type).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from engine.core.config import GenerationConfig
from engine.core.errors import ContextOverflow, InvalidRequest
from engine.core import clock
from engine.model import compiled_step
from engine.serving.sampling import Sampler

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
    """One sequence being generated: its ids, KV cache and sampler."""

    batched = False  # True: its decode steps run in the scheduler's batched forward (engine/serving/scheduler.py)

    def __init__(self, model, prompt_ids: list[int], config: GenerationConfig, cache=None, cached_tokens: int = 0):
        self.model = model
        self.config = config
        self.device = model.device
        self.prompt_len = len(prompt_ids)
        self.ids: list[int] = list(prompt_ids)  # prompt + output so far
        self.sampler = Sampler(config, self.device)
        capacity = cache_capacity(self.prompt_len, config)
        self.cache = cache if cache is not None else model.new_cache(capacity)
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

    def prefill_chunks(self, chunk_tokens: int) -> Iterator[int]:
        """Chunked prefill (as vLLM does it): run the uncached prompt `chunk_tokens` at a time and
        yield, after each chunk, how many prompt tokens are in the cache. Between chunks the
        caller can report progress or stop; `prefill()` then samples the first token."""
        while self.prefilled < self.prompt_len:
            end = min(self.prefilled + chunk_tokens, self.prompt_len)
            self._prefill_logits = self.model.forward(self._tensor(self.ids[self.prefilled : end]), self.cache)
            self.forward_passes += 1
            self.prefilled = end
            clock.sync(self.device)  # progress, like a token, must not run ahead of the device
            yield end

    def prefill(self) -> list[int]:
        """Run the prompt tokens not yet in the cache (all uncached ones, unless prefill_chunks
        ran); return the first output token."""
        if self.prefilled < self.prompt_len:
            self._prefill_logits = self.model.forward(self._tensor(self.ids[self.prefilled : self.prompt_len]),
                                                      self.cache)
            self.forward_passes += 1
            self.prefilled = self.prompt_len
        logits, self._prefill_logits = self._prefill_logits, None
        return self._accept([self.sampler.sample(logits)])

    def step(self) -> list[int]:
        """One decode step: feed the last token, return the next (speculation returns several)."""
        forward = compiled_step.for_model(self.model).forward if self.config.compiled_decode else self.model.forward
        logits = forward(torch.tensor(self.ids[-1:]), self.cache)  # on the host: a GPU's static step reads it there
        self.forward_passes += 1
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

    def counters(self) -> dict:
        """Figures for the Timeline's counters."""
        return {"forward_passes": self.forward_passes}

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self.prompt_len :]
