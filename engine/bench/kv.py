"""KV reuse: time to first token of a chat's 6th turn with the prefix cache vs without.

First a 6-turn conversation is played once (greedy, replies kept exactly as generated, KV reuse
on), so its history reaches about 1,500 tokens. Then the last turn is run again and again,
alternating: *with reuse* — from a fresh cache holding only what a real chat would hold at that
moment (the KV of turns 1-5: the previous prompt and reply) — and *without* (`kv_reuse` off,
the whole history prefilled). `ttft_ms` runs from the request's start to its first token
(the worker's queue is not involved); `ratio` = median without / median with. `identical` says
whether every run of the last turn, with and without, gave the same token ids.

`--kv-dtypes fp16,bf16,int8` runs the KV cache precision comparison instead (engine/bench/kv_precision.py):
greedy and top-1 agreement with the model-dtype cache over the long prompt set, and decode speed after a
short and after a ~1,400-token prompt per precision, alternating.
"""

from __future__ import annotations

import torch

from engine.bench import kv_precision, load_model, median, run_request
from engine.bench.long_prompts import ARTICLE

TURNS = [
    f"Here are notes about our business:\n\n{ARTICLE}\n\nSummarize the main problems in a few sentences.",
    "Which of the three planned changes would you try first, and why?",
    "How could we reduce the waste of rye loaves without upsetting the customers who buy them?",
    "Draft a short, polite message to the cafes about the new payment terms.",
    "What are the risks of opening on Sunday mornings, given that the owners are already tired?",
    "Put everything together: give us a plan for next year as a short numbered list.",
]


def add_args(p):
    p.add_argument("--max-new-tokens", type=int, default=200, help="reply length cap for turns 1-5")
    p.add_argument("--last-tokens", type=int, default=32, help="tokens generated in the measured last turn")
    p.add_argument("--runs", type=int, default=5, help="alternating runs of the last turn per variant")
    kv_precision.add_args(p)


def run(args, out):
    if args.kv_dtypes:
        return kv_precision.run(args, out)
    from engine.core.config import GenerationConfig
    from engine.serving.prefix_cache import PrefixCache
    from engine.serving.sessions import Conversation

    lm = load_model(args)
    out(f"model {lm.name} {lm.dtype_name} on {lm.device}, {torch.get_num_threads()} threads; "
        f"{len(TURNS)} turns, replies up to {args.max_new_tokens} tokens, {args.runs} alternating runs")

    # Play turns 1-5 once, with reuse, as a chat would.
    history_cache = PrefixCache()
    conv = Conversation("bench")
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=args.max_new_tokens)
    turns = []
    for i, text in enumerate(TURNS[:-1], 1):
        done = run_request(lm, conv.send(text), greedy, session=conv.session, prefix_cache=history_cache)
        conv.add_reply(done)
        tl = done.timeline
        turns.append({"turn": i, "prompt_tokens": tl.prompt_tokens, "cached_tokens": tl.cached_tokens,
                      "ttft_ms": round(tl.ttft_ms, 1), "output_tokens": tl.output_tokens})
        out(f"  turn {i}: prompt {tl.prompt_tokens:5d} tok ({tl.cached_tokens:5d} cached)  "
            f"ttft {tl.ttft_ms:7.1f} ms  reply {tl.output_tokens} tok")
    # What the cache holds when the user sends turn 6: the KV of turn 5's prompt and reply.
    state = max(history_cache.entries(), key=lambda e: e.length)

    messages = conv.send(TURNS[-1])
    last = GenerationConfig(temperature=0.0, max_new_tokens=args.last_tokens)
    with_reuse, without, outputs = [], [], []
    for r in range(args.runs):
        cache = PrefixCache()
        cache.insert(cache.key_for(lm.model), cache.scope_for(conv.session), state.ids, state.kv.copy_prefix())
        a = run_request(lm, messages, last, session=conv.session, prefix_cache=cache)
        b = run_request(lm, messages, last.replace(kv_reuse=False), session=conv.session)
        with_reuse.append(a.timeline)
        without.append(b.timeline)
        outputs += [a.token_ids, b.token_ids]
        out(f"  run {r + 1}: with reuse ttft {a.timeline.ttft_ms:7.1f} ms ({a.timeline.cached_tokens} cached, "
            f"{a.timeline.prefill_tokens} prefilled)   without {b.timeline.ttft_ms:7.1f} ms "
            f"({b.timeline.prefill_tokens} prefilled)")

    ttft_with = median([t.ttft_ms for t in with_reuse])
    ttft_without = median([t.ttft_ms for t in without])
    identical = all(o == outputs[0] for o in outputs)
    ratio = ttft_without / ttft_with
    tl = with_reuse[0]
    out(f"last turn: prompt {tl.prompt_tokens} tokens, {tl.cached_tokens} cached; median ttft with reuse "
        f"{ttft_with:.1f} ms, without {ttft_without:.1f} ms, ratio {ratio:.1f}, identical {identical}")
    return {
        "ttft_ms_with_reuse": round(ttft_with, 2),
        "ttft_ms_without_reuse": round(ttft_without, 2),
        "ratio": round(ratio, 2),
        "identical": identical,
        "prompt_tokens": tl.prompt_tokens,
        "cached_tokens": tl.cached_tokens,
        "prefill_tokens": tl.prefill_tokens,
        "prefill_ms_with_reuse": round(median([t.prefill_ms for t in with_reuse]), 2),
        "setup_ms_with_reuse": round(median([t.setup_ms for t in with_reuse]), 2),
        "kv_copy_ms": round(median([t.counters.kv.kv_copy_ms for t in with_reuse]), 3),
        "prefill_ms_without_reuse": round(median([t.prefill_ms for t in without]), 2),
        "cached_kv_bytes": state.nbytes,
        "dtype": lm.dtype_name,
        "threads": torch.get_num_threads(),
        "runs": args.runs,
        "turns": turns,
    }
