"""The load's conversations and their judge: a fixed pool of conversations (two turns, or --turns)
with mixed toggles, each turn's reference reply (the same request alone, first), and the verdict on a reply
streamed under load (exact, a cancelled prefix, crossed with another's, mismatched or, where the
server does not promise exact replies, differs, lost, stuck). clients.py drives the pool through the API."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

PROMPTS = [
    ("Name three colors of the rainbow.", "Which of them is your favorite?"),
    ("What is the capital of France?", "And of Italy?"),
    ("Give one tip for sleeping well.", "Give another one."),
    ("Write a haiku about the sea.", "Now one about the mountains."),
    ("How many legs does a spider have?", "And an ant?"),
    ("Describe a cat in one sentence.", "Now describe a dog."),
    ("What is two plus three?", "Multiply that by four."),
    ("Suggest a name for a bakery.", "Suggest one for a bookshop."),
    ("Explain what a noun is.", "What is a verb?"),
    ("Name a planet in the solar system.", "Name a bigger one."),
    ("What do bees make?", "How do they make it?"),
    ("Say hello in Spanish.", "Now in German."),
]

# Turns 3 and on of a longer conversation (--turns): short follow-ups, so each turn adds a little to a
# history the prefix cache either still holds or must prefill again.
FOLLOW_UPS = ("Tell me more.", "Give an example.", "Say it in fewer words.", "Why is that?", "Anything else?",
              "Sum it up in one line.")


# --- the pool and its references ---------------------------------------------------------------
@dataclass
class Turn:
    key: str  # "c3t1": conversation 3, turn 1
    body: dict  # the request body, without stream fields and session
    ref_text: str = ""
    ref_prompt_tokens: int = 0
    exact: bool = True  # the server promises this reply token for token (EngineInfo.exact_replies)
    ref_e2e_ms: float | None = None  # the reference's own total time, alone (an open-loop sweep's first rate)


@dataclass
class ScriptedConversation:
    index: int
    with_session: bool
    turns: list[Turn] = field(default_factory=list)


def offered_toggles(engine, probe_tokens: int = 8, variants: str = "auto") -> dict:
    """What the engine really does: speculation if a probe reports drafted tokens, quantization
    variants that `info()` lists. A toggle the engine would accept but ignore is not offered."""
    from engine.core.config import GenerationConfig

    offers = {"speculative": None, "quantization": None}
    probe = engine.complete([{"role": "user", "content": "Repeat: one two three one two three one two three"}],
                            GenerationConfig(temperature=0.0, max_new_tokens=probe_tokens, speculative="prompt_lookup"))
    if probe.timeline.counters.speculation is not None:
        offers["speculative"] = "prompt_lookup"
    if variants != "none":
        names = [v.name for v in engine.info().variants if not v.default and v.available]
        offers["quantization"] = (names[0] if variants == "auto" else variants) if names else None
    return offers


def build_pool(conversations: int, max_new_tokens: int, offers: dict, turns: int = 2,
               reuse_only: bool = False) -> list[ScriptedConversation]:
    """Conversations of `turns` turns with mixed toggles, cycling: reuse on + session, reuse off +
    session, seeded sampling + reuse + session, reuse on without a session, then speculation / a
    quantized variant. `reuse_only`: every conversation greedy with KV reuse in a session (a study
    of KV reuse under load, server/load/reuse.py)."""
    if turns < 1:
        raise ValueError("a conversation has at least 1 turn")
    kinds = ["reuse", "no_reuse", "sampled", "no_session"] if not reuse_only else ["reuse"]
    if offers.get("speculative") and not reuse_only:
        kinds.append("speculative")
    if offers.get("quantization") and not reuse_only:
        kinds.append("quantized")
    pool = []
    for i in range(conversations):
        kind = kinds[i % len(kinds)]
        first, second = PROMPTS[i % len(PROMPTS)]
        if i >= len(PROMPTS):
            first = f"{first} (take {i // len(PROMPTS) + 1})"
        body = {"max_tokens": max_new_tokens, "temperature": 0.0, "kv_reuse": kind != "no_reuse"}
        if kind == "sampled":
            body.update(temperature=0.7, top_p=0.9, seed=1000 + i)
        if kind == "speculative":
            body.update(speculative=offers["speculative"], num_speculative_tokens=4)
        if kind == "quantized":  # alone, unshared: exactness across reuse is an fp32 promise only
            body.update(quantization=offers["quantization"], kv_reuse=False)
        conv = ScriptedConversation(i, with_session=kind not in ("no_session", "quantized"))
        texts = [first, second, *(FOLLOW_UPS[(i + j) % len(FOLLOW_UPS)] for j in range(turns - 2))][:turns]
        for j, text in enumerate(texts):
            conv.turns.append(Turn(f"c{i}t{j + 1}", {**body, "messages": [{"role": "user", "content": text}]}))
        pool.append(conv)
    return pool


def compute_references(engine, pool: list[ScriptedConversation], progress=None) -> None:
    """Each turn alone, in-process, one at a time, no session: what the load's replies must equal (or,
    where the engine does not promise exact replies, `Turn.exact` False, what they are compared with).
    Turn 2's history holds turn 1's reference reply, exactly as the clients will send it.
    `progress(done, total)`: called after each turn."""
    from server.protocol import parse_chat_request

    total, done_turns = sum(len(c.turns) for c in pool), 0
    info = engine.info()
    for conv in pool:
        history = []
        for turn in conv.turns:
            turn.body["messages"] = history + turn.body["messages"][-1:]
            config = parse_chat_request(turn.body).config  # the very config the API will build
            done = engine.complete(turn.body["messages"], config)
            turn.ref_text, turn.ref_prompt_tokens = done.text, done.timeline.prompt_tokens
            turn.ref_e2e_ms = done.timeline.e2e_ms
            turn.exact = info.exact_replies(config.quantization)
            history = turn.body["messages"] + [{"role": "assistant", "content": done.text}]
            done_turns += 1
            if progress is not None:
                progress(done_turns, total)


# --- the clients -------------------------------------------------------------------------------
@dataclass
class Result:
    key: str
    clients: int
    outcome: str = ""  # exact | differs | cancelled | lost | crossed | mismatched | stuck | 5xx | 4xx | 429
    status: int | None = None
    text: str = ""
    timings: dict | None = None
    client_ttft_ms: float | None = None
    error: str | None = None
    client_e2e_ms: float | None = None  # request sent -> stream ended (this client's clock)
    client_itl_ms: list | None = None  # gaps between text chunks (this client's clock)
    output_tokens: int | None = None  # usage.completion_tokens, else the server's timings
    prompt_tokens: int | None = None  # usage.prompt_tokens
    sent_s: float | None = None  # open loop: when it was sent, seconds after the level started
    think_s: float | None = None  # closed loop with think time: the client's pause before this turn


async def one_request(http, url: str, turn: Turn, session: str | None, cancel: str | None, deadline: float,
                      clients: int) -> Result:
    """Stream one request. `cancel`: None, "queued" (leave after 50 ms, whatever the state) or
    "midway" (leave after 2 text chunks)."""
    from httpx_sse import EventSource

    body = {**turn.body, "stream": True, "stream_options": {"include_usage": True}}
    if session:
        body["session"] = session
    r = Result(turn.key, clients)
    parts: list[str] = []
    chunk_at: list[float] = []
    t0 = time.perf_counter()

    async def stream():
        async with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            r.status = resp.status_code
            if resp.status_code != 200:
                err = json.loads(await resp.aread()).get("error", {})
                r.error = err.get("message")
                r.outcome = "5xx" if resp.status_code >= 500 else "429" if resp.status_code == 429 else "4xx"
                return
            async for sse in EventSource(resp).aiter_sse():
                if sse.data == "[DONE]":
                    r.outcome = r.outcome or "lost"  # [DONE] without a finish chunk
                    return
                chunk = json.loads(sse.data)
                if chunk.get("usage"):
                    r.output_tokens = chunk["usage"].get("completion_tokens")
                    r.prompt_tokens = chunk["usage"].get("prompt_tokens")
                if "error" in chunk:
                    r.error = chunk["error"].get("message")
                    r.outcome = "5xx" if chunk["error"].get("type") == "server_error" else "4xx"
                    return
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        chunk_at.append(time.perf_counter())
                        r.client_ttft_ms = r.client_ttft_ms or (chunk_at[-1] - t0) * 1e3
                        parts.append(text)
                    if choice.get("finish_reason"):
                        r.timings = chunk.get("timings")
                        r.outcome = "done"
                if cancel == "midway" and len(parts) >= 2 and r.outcome != "done":
                    r.outcome = "cancelled"
                    return  # leaving the block closes the connection mid-stream
            r.outcome = r.outcome if r.outcome == "done" else "lost"  # the stream ended early

    try:
        if cancel == "queued":
            try:
                await asyncio.wait_for(stream(), 0.05)
            except asyncio.TimeoutError:
                r.outcome = "cancelled"
        else:
            await asyncio.wait_for(stream(), deadline)
    except asyncio.TimeoutError:
        r.outcome = "stuck"
    except Exception as exc:  # a connection that broke, a body that is not JSON: the reply is lost
        r.outcome, r.error = "lost", f"{type(exc).__name__}: {exc}"
    r.text = "".join(parts)
    r.client_e2e_ms = (time.perf_counter() - t0) * 1e3
    r.client_itl_ms = [round((b - a) * 1e3, 3) for a, b in itertools.pairwise(chunk_at)]
    if r.output_tokens is None and r.timings:
        r.output_tokens = r.timings.get("output_tokens")
    return r


def judge(r: Result, turn: Turn, references: dict[str, str]) -> str:
    """exact / cancelled (a prefix of its own reference), else crossed (another's), else mismatched
    where the server promises exact replies and differs where it does not (bf16, quantized weights, a
    remote server: a batch or a cached prefix may take a near-tie the other way)."""
    if r.outcome not in ("done", "cancelled"):
        return r.outcome
    own = r.text == turn.ref_text if r.outcome == "done" else turn.ref_text.startswith(r.text)
    if r.outcome == "done" and (r.timings or {}).get("prompt_tokens", r.prompt_tokens) != turn.ref_prompt_tokens:
        own = False  # the right text for another prompt would be no better
    if own:
        return "exact" if r.outcome == "done" else "cancelled"
    others = [k for k, ref in references.items() if k != turn.key and
              (ref == r.text if r.outcome == "done" else ref.startswith(r.text))]
    if others:
        return "crossed"
    return "mismatched" if turn.exact else "differs"
