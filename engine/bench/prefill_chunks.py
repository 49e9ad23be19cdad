"""What chunked prefill costs: total prefill time of a long prompt, one forward vs chunks of N.

Chunking trades one big forward for several smaller ones: each chunk re-reads the weights, its
matmuls have fewer rows, and every chunk computes one row of logits that only the last one
needs. In return the page can show progress (and Stop works) between chunks. This scenario
times `prefill_ms` (prefill forward begins → first token sampled) for each chunk size, in
alternating rounds, and reports the median cost against one forward, plus how soon the first
progress event comes (the time the page's progress bar first moves). Costs are medians of the
per-round ratios to one forward (paired), in wall time and in CPU time.
"""

from __future__ import annotations

import time

import torch

from engine.cli import comma_list
from engine.bench import load_model, median
from engine.core import clock

# A long, ordinary chat turn: about 1,500 tokens with the chat template.
PARAGRAPH = ("The city council met on Tuesday to discuss the new public library. The architect presented three "
             "designs: a glass pavilion by the river, a converted warehouse near the station, and a small "
             "building in each district. Residents asked about opening hours, parking, and the cost of running "
             "three buildings instead of one. ")


def add_args(p):
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--chunks", default="64,128,256,512", type=comma_list(int, 1),
                   help="chunk sizes to compare with one forward")
    p.add_argument("--rounds", type=int, default=5)


def prompt_ids(tokenizer, n: int) -> list[int]:
    from engine.serving.generate import build_prompt_ids

    text = PARAGRAPH
    while len(build_prompt_ids(tokenizer, [{"role": "user", "content": text}])) < n:
        text += " " + PARAGRAPH
    ids = build_prompt_ids(tokenizer, [{"role": "user", "content": text}])
    return ids[: n - 5] + ids[-5:]  # keep the template's closing tokens (assistant turn start)


def time_prefill(lm, ids: list[int], chunk: int | None) -> tuple[float, float, float, int]:
    """(prefill ms, CPU ms, ms to the first chunk done, first token) for one prefill; chunk None: one forward.

    CPU time (all of this process's threads) is reported beside wall time: on a machine shared with
    other jobs, wall time swings between identical runs far more than CPU time (docs/history.md)."""
    from engine.core.config import GenerationConfig
    from engine.bench import runner_for
    from engine.serving.decoding import Decoding

    dec = Decoding(runner_for(lm), ids, GenerationConfig(max_new_tokens=1, temperature=0.0))
    t0, c0 = clock.done_s(lm.device), time.process_time()
    first_chunk = None
    if chunk:
        for _ in dec.prefill_chunks(chunk):  # each chunk's progress follows the device (Decoding waits)
            first_chunk = first_chunk or clock.done_s(lm.device)
    token = dec.prefill()[0]
    t1, c1 = clock.done_s(lm.device), time.process_time()
    return (t1 - t0) * 1e3, (c1 - c0) * 1e3, ((first_chunk or t1) - t0) * 1e3, token


def run(args, out):
    lm = load_model(args)
    ids = prompt_ids(lm.tokenizer, args.prompt_tokens)
    sizes = [None] + args.chunks
    name = lambda c: "one forward" if c is None else f"chunks of {c}"  # noqa: E731
    out(f"{lm.info()['name']} {lm.info()['dtype']}, {len(ids)}-token prompt, {torch.get_num_threads()} threads, "
        f"{args.rounds} alternating rounds")
    time_prefill(lm, ids, None)  # warm-up
    times = {c: [] for c in sizes}
    cpu = {c: [] for c in sizes}
    firsts = {c: [] for c in sizes}
    tokens = {}
    for r in range(args.rounds):
        order = sizes if r % 2 == 0 else sizes[::-1]
        for c in order:
            ms, cpu_ms, first, tok = time_prefill(lm, ids, c)
            times[c].append(ms)
            cpu[c].append(cpu_ms)
            firsts[c].append(first)
            tokens[c] = tok
    base = median(times[None])
    results = {}
    for c in sizes:
        m = median(times[c])
        # paired per round: each chunked time against the one-forward time of the same round
        paired = median([t / b for t, b in zip(times[c], times[None])])
        cpu_paired = median([t / b for t, b in zip(cpu[c], cpu[None])])
        results[name(c)] = {"chunk_tokens": c, "prefill_ms": round(m, 1), "cost_vs_one_forward": round(paired - 1, 4),
                            "cpu_ms": round(median(cpu[c]), 1), "cpu_cost_vs_one_forward": round(cpu_paired - 1, 4),
                            "first_progress_ms": round(median(firsts[c]), 1), "first_token": tokens[c]}
        out(f"{name(c):>14}: prefill {m:7.1f} ms, cost {100 * (paired - 1):+5.1f}% | CPU {median(cpu[c]):7.1f} ms, "
            f"cost {100 * (cpu_paired - 1):+5.1f}% | first progress after {median(firsts[c]):6.1f} ms | "
            f"first token {tokens[c]}")
    return {"prompt_tokens": len(ids), "dtype": lm.info()["dtype"], "threads": torch.get_num_threads(),
            "rounds": args.rounds, "one_forward_ms": round(base, 1), "sizes": results,
            "ratio": results.get("chunks of 256", {}).get("cpu_cost_vs_one_forward")}
