"""What a forward over T tokens costs relative to a one-token decode step, through each fp32 kernel
plan the one decision can take (engine/runtime/plan.py: our kernel, the packed oneDNN copy, MKL's
GEMV for one row): the price of a speculative verify pass (T = k + 1) and of short prefills."""

from __future__ import annotations

import torch

from engine.cli import comma_list
from engine.bench import load_model, median
from engine.core import clock


def add_args(p):
    p.add_argument("--context", type=int, default=300, help="tokens already in the cache")
    p.add_argument("--tokens", default="1,2,3,5,9,17", type=comma_list(int, 1), help="forward lengths T to time")
    p.add_argument("--rounds", type=int, default=7)


def run(args, out):
    from engine.bench import runner_for
    from engine.kernels import catalogue, cpu_gemm
    from engine.platform import capabilities

    lm = load_model(args)
    sizes = args.tokens
    chosen = runner_for(lm).plan.one_row
    names = ([n for n in ("gemv", "packed") if capabilities.detect().packed_fp32_weights]
             + (["ours"] if cpu_gemm.available() else [])) if chosen else [None]
    runners = runners_for(lm.model, names)
    device = runners[names[0]].device
    gen = torch.Generator().manual_seed(0)
    cache = runners[names[0]].new_cache(args.context + max(sizes) + 1)
    runners[names[0]].forward(torch.randint(100, 20000, (args.context,), generator=gen).to(device), cache)
    times = {(name, t): [] for name in names for t in sizes}
    for _ in range(args.rounds):  # alternate every configuration within each round
        for name in names:
            for t in sizes:
                cache.crop(args.context)
                ids = torch.randint(100, 20000, (t,), generator=gen).to(device)  # the ids go where the model is
                t0 = clock.done_s(device)
                runners[name].forward(ids, cache, all_logits=True)
                times[(name, t)].append(clock.done_s(device) - t0)
    out(f"model {lm.name} {lm.dtype_name}, {torch.get_num_threads()} threads, {args.context} tokens of context, "
        f"{args.rounds} rounds; cost in one-token steps (median ms); the engine's choice: {chosen}")
    rows = []
    for t in sizes:
        row = {"tokens": t}
        for name in names:
            ms = median(times[(name, t)]) * 1e3
            row[f"{name}_ms"] = round(ms, 2)
            row[f"{name}_steps"] = round(ms / (median(times[(name, 1)]) * 1e3), 3)
        rows.append(row)
        out(f"  T={t:3d}: " + " | ".join(f"{n} {row[f'{n}_ms']:7.1f} ms = {row[f'{n}_steps']:.2f} steps" for n in names))
    five = next((r for r in rows if r["tokens"] == 5), rows[-1])
    base = "gemv" if "gemv" in names else names[0]
    return {"rows": rows, "ratio": round(five[f"{base}_steps"] / five[f"{chosen}_steps"], 3)
            if f"{chosen}_steps" in five else None,
            "dtype": lm.dtype_name, "packed_weight_mb": round(catalogue.packed_bytes() / 1e6, 1)}


def runners_for(model, names) -> dict:
    """A runner per fp32 one-row choice in `names` (each plan the decision can take; None: the model's own)."""
    from engine.runtime.plan import make_plan
    from engine.runtime.runner import Runner

    return {name: Runner(model, make_plan(model, one_row=name)) for name in names}
