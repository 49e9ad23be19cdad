"""The decode loop: setup → prefill → first token → decode → stop, each stage timed.

`Decoding` (engine/serving/decoding.py) holds one sequence's state (token ids, KV cache, sampler) and knows
how to prefill and take one decode step. `generate` drives it for a request, turns token ids into text, applies
the stop rules and records every timestamp on the request's `Timeline`. It yields `Event`s, which
the worker forwards to whoever waits (CLI, API, page), and, for a batched sequence, the scheduler's
own `Step`/`Pause` signals (engine/serving/decoding.py), which the worker keeps to itself.
The request is trusted: its GenerationConfig and its messages were checked when they were made.

Stopping: EOS, a stop string, `max_new_tokens`, or cancellation, checked before every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.core.config import GenerationConfig
from engine.core.request import Event, Request
from engine.core.timeline import Timeline, now_ns
from engine.serving.decoding import Decoding, Pause, Step, cache_capacity, check_lengths
from engine.serving.detokenize import IncrementalDetokenizer, StopStrings
from engine.serving.prefix_cache import PrefixCache
from engine.serving.request_reuse import RequestReuse


def build_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Render chat messages with the model's chat template and tokenize them. The messages are the
    caller's, checked where they entered (a Request's are: engine/core/request.py validate_messages)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return tokenizer(text)["input_ids"]


def generate(
    runner,
    tokenizer,
    eos_token_ids: set[int],
    request: Request,
    timeline: Timeline,
    should_stop: Callable[[], bool] = lambda: False,
    decoding_factory: Callable[..., Decoding] | None = None,
    prefix_cache: PrefixCache | None = None,
    draft=None,
) -> Iterator[Event | Step | Pause]:
    """Answer one request, yielding status, chunk and finally a done event (and, for a batched
    sequence, `Step`/`Pause` signals for the scheduler between them).

    `runner`: the variant's runner (engine/runtime/runner.py). Raises InvalidRequest (before any
    token) for requests the engine cannot run. With a `prefix_cache` (and `kv_reuse` on), the longest
    cached prefix of the prompt is not prefilled, and the finished sequence's KV is kept for the next
    request of the same scope. `decoding_factory` None: `Decoding` (a speculative request's speculation
    is its own); `draft`: the loaded draft model for speculative='draft'.
    """
    cfg = request.config  # valid since it was made
    yield Event("status", stage="setup")
    prompt_ids = list(request.prompt_ids) if request.prompt_ids is not None else build_prompt_ids(
        tokenizer, request.messages
    )
    check_lengths(len(prompt_ids), cfg, runner.max_context)
    t0 = now_ns()
    reuse = RequestReuse(prefix_cache, runner.model, request.session, cfg.kv_reuse, prompt_ids,
                         cache_capacity(len(prompt_ids), cfg), kv=cfg.kv_cache_dtype)
    if reuse.lease is not None:  # the prefix cache was asked: its lookup and the KV copy (or handover)
        timeline.add_span("kv_lookup", t0, kv_copy_ms=round(reuse.copy_ms, 3), handover=reuse.handover,
                          cached_tokens=reuse.cached_tokens)
    try:
        yield from _answer(runner, tokenizer, eos_token_ids, cfg, prompt_ids, reuse, timeline, should_stop,
                           decoding_factory or Decoding, draft)
    finally:
        reuse.release()  # also on error or an abandoned generator; nothing half-done is kept


def _answer(runner, tokenizer, eos_token_ids, cfg, prompt_ids, reuse, timeline, should_stop, decoding_factory, draft):
    """generate's body once the prompt is known and the cache looked up: prefill, decode, stop."""
    if cfg.compiled_decode:  # compiled (CPU) or captured (GPU) in the setup of a request that asks (InvalidRequest: cannot here)
        t0, stage = now_ns(), runner.setup_stage
        if runner.prepare("compiled", tokenizer, cache_capacity(len(prompt_ids), cfg)):
            ms = round((timeline.add_span(stage, t0) - t0) / 1e6, 1)
            if stage == "capture":
                timeline.counters.capture_ms = ms
            else:
                timeline.counters.compile_ms = ms
        timeline.counters.decode_step = "compiled"
    dec = decoding_factory(runner, prompt_ids, cfg, cache=reuse.kv, cached_tokens=reuse.cached_tokens, draft=draft)
    timeline.prompt_tokens = len(prompt_ids)
    timeline.cached_tokens = dec.cached_tokens
    timeline.prefill_tokens = len(prompt_ids) - dec.cached_tokens
    timeline.counters.seed = dec.sampler.seed
    timeline.counters.kv = reuse.counters()
    timeline.mark("setup_done")
    yield Event("status", stage="prefill", detail={"prefill_tokens": timeline.prefill_tokens})

    detok = IncrementalDetokenizer(tokenizer)
    stops = StopStrings(cfg.stop)
    text_parts: list[str] = []
    finish, hit_stop, produced = None, False, 0
    timeline.prefill_start_ns = now_ns()
    new_tokens = yield from _prefill(dec, cfg, should_stop, timeline)
    while True:
        t = now_ns()
        kept, finish = _truncate(new_tokens, eos_token_ids, cfg.max_new_tokens - produced)
        timeline.add_tokens(len(kept), t)
        if getattr(dec, "batched", False):  # continuous batching: how many sequences the forward that made them ran
            timeline.batch_size.extend([dec.batch_size] * len(kept))
            timeline.batch_prompt_tokens.extend([dec.batch_prompt_tokens] * len(kept))
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
        spec = getattr(dec, "speculation", None)
        drafted, accepted = (spec.drafted, spec.accepted) if spec is not None else (None, None)
        new_tokens = yield from _decode_step(dec)
        if spec is not None and spec.drafted > drafted:  # a speculative step: its guesses and hits
            timeline.add_span("speculative_step", t, drafted=spec.drafted - drafted, accepted=spec.accepted - accepted)

    if not hit_stop:  # text held back (an unfinished character, a possible stop string) is real text
        tail, hit_stop = stops.push(detok.flush())
        tail += "" if hit_stop else stops.flush()
        finish = "stop" if hit_stop else finish
        if tail:
            text_parts.append(tail)
            yield Event("chunk", text=tail, token_ids=[], output_tokens=produced)
    dec.truncate(dec.prompt_len + produced)
    timeline.finish_reason = finish
    timeline.counters.forward_passes = dec.forward_passes
    timeline.counters.speculation = dec.speculation.counters(dec.forward_passes) if dec.speculation is not None else None
    timeline.mark("done")
    reuse.keep(dec)  # after a cancel too: between steps the sequence and its KV agree
    yield Event("done", text="".join(text_parts), token_ids=dec.output_ids[:produced], output_tokens=produced,
                detail={"finish_reason": finish}, timeline=timeline)


def _decode_step(dec: Decoding):
    """One decode step. A batched sequence (engine/serving/scheduler.py) first yields a `Step` and
    waits: the scheduler runs one forward for every sequence waiting so, hands each its logits,
    and resumes it. Any other sequence steps by itself."""
    if getattr(dec, "batched", False):
        yield Step(dec)
    return dec.step()


def _prefill(dec: Decoding, cfg: GenerationConfig, should_stop: Callable[[], bool], timeline: Timeline):
    """Prefill; chunked when the request asks, with a progress event after each chunk (prompt
    tokens prefilled of `prefill_tokens`, ending at the total) and Stop honoured between chunks.
    A batched sequence yields a `Step` for each chunk of its prompt (`dec.next_rows`): the
    scheduler runs it in the same forward as the running batch's decode step (with the chunked
    toggle: a `Pause` after each chunk, which runs alone).
    Each chunk is recorded on the timeline (`prefill_chunk` spans) for the trace.
    Returns the first token(s), or [] when stopped before the prompt was through."""
    total, batched = dec.prompt_len - dec.cached_tokens, getattr(dec, "batched", False)
    if cfg.chunked_prefill:
        def progress(done: int) -> Event:
            return Event("status", stage="prefill", detail={"prefill_tokens": total, "prefilled_tokens": done})

        yield progress(0)
        start, before = now_ns(), dec.cached_tokens
        for end in dec.prefill_chunks(cfg.prefill_chunk_tokens):  # each chunk runs alone, in this generator
            timeline.add_span("prefill_chunk", start, tokens=end - before)
            before = end
            yield progress(end - dec.cached_tokens)
            if end < dec.prompt_len and batched:
                yield Pause()
            if end < dec.prompt_len and should_stop():
                return []
            start = now_ns()
    elif batched:  # each chunk (dec.next_rows) runs in the scheduler's forward, beside the batch's decode step
        while dec.prefilled < dec.prompt_len:
            start, before = now_ns(), dec.prefilled
            yield Step(dec)
            timeline.add_span("prefill_chunk", start, tokens=dec.prefilled - before, batch_size=dec.batch_size,
                              batch_prompt_tokens=dec.batch_prompt_tokens)
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
