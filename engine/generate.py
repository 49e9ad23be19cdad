"""The decode loop: setup → prefill → first token → decode → stop, each stage timed.

`Decoding` holds one sequence's state (token ids, KV cache, sampler) and knows how to prefill
and take one decode step. `generate` drives it for a request, turns token ids into text, applies
the stop rules and records every timestamp on the request's `Timeline`. It yields `Event`s;
the worker forwards them to whoever waits (CLI, API, page).

Stopping: EOS, a stop string, `max_new_tokens`, or cancellation, checked before every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .config import GenerationConfig
from .detokenize import IncrementalDetokenizer, StopStrings
from .errors import ContextOverflow, InvalidRequest
from .prefix_cache import PrefixCache, RequestReuse
from .sampling import Sampler
from .timeline import Timeline, now_ns

SPECULATION_SLACK = 17  # spare cache room: a verify pass may write k+1 positions past the end


@dataclass
class Request:
    """What to answer: chat `messages` (rendered with the chat template) or ready `prompt_ids`."""

    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    config: GenerationConfig = field(default_factory=GenerationConfig)
    session: str | None = None  # prefix-cache scope (KV reuse); None: private to this request
    id: str = ""


@dataclass
class Event:
    kind: str  # status | chunk | done | error (and, between generate and the batch scheduler only: step | pause)
    text: str = ""  # chunk: the new text; done: the whole reply
    token_ids: list[int] = field(default_factory=list)  # chunk: new ids; done: all output ids
    output_tokens: int = 0  # tokens sampled so far
    stage: str = ""  # status: queued | setup | prefill | decode
    detail: dict = field(default_factory=dict)  # status/done/error specifics
    timeline: Timeline | None = None
    decoding: Decoding | None = None  # done: the finished sequence (cache None once the prefix cache kept it)

    def to_dict(self) -> dict:
        d = {"kind": self.kind, "text": self.text, "token_ids": list(self.token_ids),
             "output_tokens": self.output_tokens, "stage": self.stage, "detail": {k: v for k, v in self.detail.items() if k != "exception"}}
        if self.timeline is not None and self.kind in ("done", "error"):
            d["timeline"] = self.timeline.to_dict()
        return d


def validate_messages(messages) -> list[dict]:
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
    return out


def _is_unicode(text: str) -> bool:
    """False for text a tokenizer cannot take: lone surrogates (JSON allows "\\ud800"; UTF-8 does not)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def build_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Render chat messages with the model's chat template and tokenize them."""
    messages = validate_messages(messages)
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return tokenizer(text)["input_ids"]


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


class Decoding:
    """One sequence being generated: its ids, KV cache and sampler."""

    batched = False  # True: its decode steps run in the scheduler's batched forward (engine/scheduler.py)

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
            if self.device.type == "cuda":  # progress, like a token, must not run ahead of the GPU
                torch.cuda.synchronize(self.device)
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
        logits = self.model.forward(self._tensor(self.ids[-1:]), self.cache)
        self.forward_passes += 1
        return self._accept([self.sampler.sample(logits)])

    def _accept(self, tokens: list[int]) -> list[int]:
        self.ids.extend(tokens)
        if self.device.type == "cuda":  # a timestamp that claims a token exists must follow the GPU
            torch.cuda.synchronize(self.device)
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


def decoding_for(config: GenerationConfig, draft=None) -> Callable[..., Decoding]:
    """The Decoding a request's toggles ask for (called as factory(model, prompt_ids, config, ...))."""
    if config.speculative == "off":
        return Decoding
    from functools import partial

    from .speculative import SpeculativeDecoding

    return partial(SpeculativeDecoding, draft=draft)


def generate(
    model,
    tokenizer,
    eos_token_ids: set[int],
    request: Request,
    timeline: Timeline,
    should_stop: Callable[[], bool] = lambda: False,
    decoding_factory: Callable[..., Decoding] | None = None,
    prefix_cache: PrefixCache | None = None,
    draft=None,
) -> Iterator[Event]:
    """Answer one request, yielding status, chunk and finally a done event.

    Raises InvalidRequest (before any token) for requests the engine cannot run. With a
    `prefix_cache` (and `kv_reuse` on), the longest cached prefix of the prompt is not prefilled,
    and the finished sequence's KV is kept for the next request of the same scope.
    `decoding_factory` None: chosen by the request's toggles (`decoding_for`); `draft`: the loaded
    draft model for speculative='draft'.
    """
    cfg = request.config.validate()
    yield Event("status", stage="setup")
    prompt_ids = list(request.prompt_ids) if request.prompt_ids is not None else build_prompt_ids(
        tokenizer, request.messages
    )
    check_lengths(len(prompt_ids), cfg, model.max_context)
    reuse = RequestReuse(prefix_cache, model, request.session, cfg.kv_reuse, prompt_ids,
                         cache_capacity(len(prompt_ids), cfg))
    try:
        yield from _answer(model, tokenizer, eos_token_ids, cfg, prompt_ids, reuse, timeline, should_stop,
                           decoding_factory or decoding_for(cfg, draft))
    finally:
        reuse.release()  # also on error or an abandoned generator; nothing half-done is kept


def _answer(model, tokenizer, eos_token_ids, cfg, prompt_ids, reuse, timeline, should_stop, decoding_factory):
    """generate's body once the prompt is known and the cache looked up: prefill, decode, stop."""
    dec = decoding_factory(model, prompt_ids, cfg, cache=reuse.kv, cached_tokens=reuse.cached_tokens)
    timeline.prompt_tokens = len(prompt_ids)
    timeline.cached_tokens = dec.cached_tokens
    timeline.prefill_tokens = len(prompt_ids) - dec.cached_tokens
    timeline.counters["seed"] = dec.sampler.seed
    timeline.counters.update(reuse.counters())
    timeline.mark("setup_done")
    yield Event("status", stage="prefill", detail={"prefill_tokens": timeline.prefill_tokens})

    detok = IncrementalDetokenizer(tokenizer)
    stops = StopStrings(cfg.stop)
    text_parts: list[str] = []
    finish, hit_stop, produced = None, False, 0
    timeline.prefill_start_ns = now_ns()
    new_tokens = yield from _prefill(dec, cfg, should_stop)
    while True:
        t = now_ns()
        kept, finish = _truncate(new_tokens, eos_token_ids, cfg.max_new_tokens - produced)
        timeline.add_tokens(len(kept), t)
        if getattr(dec, "batched", False):  # continuous batching: how many sequences the forward that made them ran
            timeline.batch_size.extend([dec.batch_size] * len(kept))
        produced += len(kept)
        shown, hit_stop = stops.push(detok.add([tok for tok in kept if tok not in eos_token_ids]))
        if hit_stop:
            finish = "stop"
        text_parts.append(shown)
        yield Event("chunk", text=shown, token_ids=kept, output_tokens=produced)
        if finish is None and should_stop():
            finish = "cancelled"
        if finish is not None:
            break
        new_tokens = yield from _decode_step(dec)

    if not hit_stop:  # text held back (an unfinished character, a possible stop string) is real text
        tail, hit_stop = stops.push(detok.flush())
        tail += "" if hit_stop else stops.flush()
        finish = "stop" if hit_stop else finish
        if tail:
            text_parts.append(tail)
            yield Event("chunk", text=tail, token_ids=[], output_tokens=produced)
    dec.truncate(dec.prompt_len + produced)
    timeline.finish_reason = finish
    timeline.counters.update(dec.counters())
    timeline.mark("done")
    reuse.keep(dec)  # after a cancel too: between steps the sequence and its KV agree
    yield Event("done", text="".join(text_parts), token_ids=dec.output_ids[:produced], output_tokens=produced,
                detail={"finish_reason": finish}, timeline=timeline, decoding=dec)


def _decode_step(dec: Decoding):
    """One decode step. A batched sequence (engine/scheduler.py) first yields a `step` event and
    waits: the scheduler runs one forward for every sequence waiting so, hands each its logits,
    and resumes it. Any other sequence steps by itself."""
    if getattr(dec, "batched", False):
        yield Event("step", decoding=dec)
    return dec.step()


def _prefill(dec: Decoding, cfg: GenerationConfig, should_stop: Callable[[], bool]):
    """Prefill; chunked when the request asks, with a progress event after each chunk (prompt
    tokens prefilled of `prefill_tokens`, ending at the total) and Stop honoured between chunks.
    A batched sequence yields a `step` event for each chunk of its prompt (`dec.next_rows`): the
    scheduler runs it in the same forward as the running batch's decode step (with the chunked
    toggle: a `pause` after each chunk, which runs alone).
    Returns the first token(s), or [] when stopped before the prompt was through."""
    total, batched = dec.prompt_len - dec.cached_tokens, getattr(dec, "batched", False)
    if cfg.chunked_prefill:
        def progress(done: int) -> Event:
            return Event("status", stage="prefill", detail={"prefill_tokens": total, "prefilled_tokens": done})

        yield progress(0)
        for end in dec.prefill_chunks(cfg.prefill_chunk_tokens):
            yield progress(end - dec.cached_tokens)
            if end < dec.prompt_len and batched:
                yield Event("pause")
            if end < dec.prompt_len and should_stop():
                return []
    elif batched:  # each chunk (dec.next_rows) runs in the scheduler's forward, beside the batch's decode step
        while dec.prefilled < dec.prompt_len:
            yield Event("step", decoding=dec)
            if dec.prefilled < dec.prompt_len and should_stop():
                return []
    return dec.prefill()


def _truncate(tokens: list[int], eos: set[int], room: int) -> tuple[list[int], str | None]:
    """Keep tokens up to and including the first EOS, and at most `room`; say why it ended."""
    kept = []
    for tok in tokens[: max(room, 0)]:
        kept.append(tok)
        if tok in eos:
            return kept, "stop"
    return kept, ("length" if len(kept) >= room else None)
