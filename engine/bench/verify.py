"""What a forward over T tokens costs relative to a one-token decode step, with oneDNN-packed
weights and without: the price of a speculative verify pass (T = k + 1) and of short prefills."""

from __future__ import annotations

import time

import torch

from engine.bench import load_model, median


def add_args(p):
    p.add_argument("--context", type=int, default=300, help="tokens already in the cache")
    p.add_argument("--tokens", default="1,2,3,5,9,17", help="forward lengths T to time")
    p.add_argument("--rounds", type=int, default=7)


def run(args, out):
    from engine.model import fast_llama

    lm = load_model(args)
    model, sizes = lm.model, [int(t) for t in args.tokens.split(",")]
    gen = torch.Generator().manual_seed(0)
    cache = model.new_cache(args.context + max(sizes) + 1)
    model.forward(torch.randint(100, 20000, (args.context,), generator=gen), cache)
    times = {(packed, t): [] for packed in (True, False) for t in sizes}
    try:
        for _ in range(args.rounds):  # alternate every configuration within each round
            for packed in (True, False):
                fast_llama.use_packed = packed
                for t in sizes:
                    cache.crop(args.context)
                    ids = torch.randint(100, 20000, (t,), generator=gen)
                    t0 = time.perf_counter()
                    model.forward(ids, cache, all_logits=True)
                    times[(packed, t)].append(time.perf_counter() - t0)
    finally:
        fast_llama.use_packed = True
    out(f"model {lm.name} {lm.dtype_name}, {torch.get_num_threads()} threads, {args.context} tokens of context, "
        f"{args.rounds} rounds; cost in one-token steps (median ms)")
    rows = []
    for t in sizes:
        row = {"tokens": t}
        for packed, label in ((True, "packed"), (False, "plain")):
            ms = median(times[(packed, t)]) * 1e3
            row[f"{label}_ms"] = round(ms, 2)
            row[f"{label}_steps"] = round(ms / (median(times[(packed, 1)]) * 1e3), 3)
        rows.append(row)
        out(f"  T={t:3d}: packed {row['packed_ms']:7.1f} ms = {row['packed_steps']:.2f} steps | "
            f"plain {row['plain_ms']:7.1f} ms = {row['plain_steps']:.2f} steps")
    five = next((r for r in rows if r["tokens"] == 5), rows[-1])
    return {"rows": rows, "ratio": round(five["plain_steps"] / five["packed_steps"], 3),
            "dtype": lm.dtype_name, "packed_weight_mb": round(fast_llama.packed_bytes() / 1e6, 1)}
