"""How far continuous batching can go on a mix, from forward costs measured alone (no server, no
clients): a lone decode step (d1), a step of B decode rows (dB), a prompt alone (P1) and beside
B - 1 decode rows (what its rows add to a shared forward: Pb). Per request, max batch 1 costs
P1 + n·d1 and max batch B costs Pb + n·dB/B, so their ratio is the most batching gives to a mix of
n output tokens and p prompt tokens a request. The defaults are the load bench's mix as measured
(`timings.output_tokens`, `prefill_tokens`: ~13 and ~28, after the chat template's 24 cached
tokens). docs/batching.md, "The ceiling on this mix"."""

from __future__ import annotations

import torch

from engine.bench import load_model, median
from engine.core import clock


def add_args(p):
    p.set_defaults(dtype="fp32")  # what the load bench measures (exact replies)
    p.add_argument("--batch", type=int, default=8, help="B: the decode rows of a batched step")
    p.add_argument("--context", type=int, default=60, help="tokens in each decode row's cache")
    p.add_argument("--prompt-tokens", type=int, default=28, help="p: prompt tokens a request prefills")
    p.add_argument("--cached-tokens", type=int, default=24, help="tokens already cached before the prompt")
    p.add_argument("--output-tokens", type=float, default=13.1, help="n: output tokens a request")
    p.add_argument("--rounds", type=int, default=15)


def request_costs(d1: float, dB: float, prompt_alone: float, prompt_added: float, n: float, B: int):
    """A request's cost one at a time (P1 + n·d1) and in a batch of B (Pb + n·dB/B), in ms."""
    return prompt_alone + n * d1, prompt_added + n * dB / B


def run(args, out):
    from engine.bench import runner_for
    from engine.core.errors import InvalidRequest
    from engine.runtime.runner import Batch

    lm = load_model(args)
    runner, B = runner_for(lm), args.batch
    if runner.plan.runner != "fast":
        raise InvalidRequest(f"{lm.name} has no batched forward here (our Llama forward): nothing to measure")
    if B < 2:
        raise InvalidRequest("--batch must be at least 2", param="batch")

    def forward_batch(rows, caches):
        return runner.run(Batch(rows, caches))

    gen = torch.Generator().manual_seed(0)

    def ids(n):
        return torch.randint(100, 20000, (n,), generator=gen).tolist()

    def primed(n):  # a cache holding n tokens, with room for the prompt
        cache = runner.new_cache(n + args.prompt_tokens + 2)
        forward_batch([ids(n)], [cache])
        return cache

    decode = [primed(args.context) for _ in range(B)]
    prompt_cache = primed(args.cached_tokens)
    prompt = ids(args.prompt_tokens)
    shapes = {  # name: (rows, caches)
        "decode_1": ([[7]], decode[:1]),
        f"decode_{B - 1}": ([[7]] * (B - 1), decode[: B - 1]),
        f"decode_{B}": ([[7]] * B, decode),
        "prompt_alone": ([prompt], [prompt_cache]),
        "prompt_beside": ([[7]] * (B - 1) + [prompt], decode[: B - 1] + [prompt_cache]),
    }
    times = {name: [] for name in shapes}
    for r in range(args.rounds + 1):  # every shape once a round: the machine's drift hits them alike
        for name, (rows, caches) in shapes.items():
            for c in caches:
                c.crop(args.cached_tokens if c is prompt_cache else args.context)
            t0 = clock.done_ns(lm.device)
            forward_batch(rows, caches)
            t1 = clock.done_ns(lm.device)
            if r:  # round 0 warms up: first-call allocations, caches
                times[name].append((t1 - t0) / 1e6)
    ms = {name: round(median(v), 2) for name, v in times.items()}
    d1, dB = ms["decode_1"], ms[f"decode_{B}"]
    added = round(ms["prompt_beside"] - ms[f"decode_{B - 1}"], 2)  # what the prompt's rows add to a shared forward
    n = args.output_tokens
    alone, batched = request_costs(d1, dB, ms["prompt_alone"], added, n, B)
    bound = round(alone / batched, 2)  # the ceiling
    out(f"model {lm.name} {lm.dtype_name}, {torch.get_num_threads()} threads, {args.rounds} rounds (median ms)")
    out(f"  decode step: 1 row {d1} ms, {B} rows {dB} ms ({dB / d1:.2f}x)")
    out(f"  {args.prompt_tokens}-token prompt after {args.cached_tokens} cached: alone {ms['prompt_alone']} ms, "
        f"beside {B - 1} decode rows +{added} ms ({added / args.prompt_tokens:.2f} ms a prompt token)")
    out(f"  per request (n = {n} output tokens): max batch 1 {alone:.0f} ms, max batch {B} {batched:.0f} ms: "
        f"a ceiling of {bound}x the output tok/s")
    return {"batch": B, "output_tokens": n, "prompt_tokens": args.prompt_tokens, "forward_ms": ms,
            "prompt_added_ms": added, "ceiling": bound, "ratio": bound, "dtype": lm.dtype_name}
