"""One decode step per quantization variant, every variant alternating in one process: the decode
ratio of each variant over the loaded model without whole replies (quick where `quant` is slow).

`--prefetch`: each w8a variant's step with its layers' weight kind (int8, 4-bit) asking for the weights 4 KB
ahead against the same weights left to the hardware's prefetchers (Plan.w8a_hardware_stream: the plan's
choice is one of the two), taking turns: the evidence behind cpu_qdot.HARDWARE_STREAM_CPUS on the CPU at
hand. Both runners hold their own C++ layer loop's arguments, so each decode step runs its own choice (the
layers' own Python-path products, a prompt's, follow the runner made last)."""

from __future__ import annotations

import torch

from engine.bench import load_model, median
from engine.core import clock

DEFAULT_VARIANTS = ("int8wo", "int8wo+head", "int4wo", "int4wo+head", "nf4")  # --variants (a load flag) overrides


def add_args(p):
    p.add_argument("--context", type=int, default=64, help="tokens already in the cache")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="decode steps per variant per round")
    p.add_argument("--prefetch", action="store_true",
                   help="each w8a variant with its plan's weight-stream choice against the other one")


def run(args, out):
    from engine.bench import Stepper, runner_for
    from engine.platform import capabilities
    from engine.serving.variants import build

    lm = load_model(args)
    if args.prefetch:
        return _prefetch(args, out, lm)
    models = {lm.dtype_name: Stepper(runner_for(lm))}
    for name in args.variants or DEFAULT_VARIANTS:
        models[name] = Stepper(build(lm, name)[1])
    times = step_times(models, args.context, args.rounds, args.steps, lm.device)
    out(f"model {lm.name} {lm.dtype_name}, {torch.get_num_threads()} threads, {capabilities.detect().summary()}")
    base = median(times[lm.dtype_name])
    rows = {}
    for name, ts in times.items():
        rows[name] = {"step_ms": round(median(ts) * 1e3, 2), "decode_vs_default": round(base / median(ts), 2)}
        out(f"{name:>12}: median decode step {rows[name]['step_ms']:7.1f} ms = {1 / median(ts):6.1f} tok/s, "
            f"{rows[name]['decode_vs_default']:.2f}x {lm.dtype_name}")
    best = max((r["decode_vs_default"] for n, r in rows.items() if n != lm.dtype_name), default=None)
    return {"variants": rows, "ratio": best, "default": lm.dtype_name}


def _prefetch(args, out, lm) -> dict:
    """--prefetch: per w8a variant, its layers' kind with and without the prefetch, paired round by round."""
    import dataclasses

    from engine.bench import Stepper
    from engine.kernels import cpu_qdot
    from engine.platform import capabilities
    from engine.runtime.runner import Runner
    from engine.serving.variants import build

    out(f"model {lm.name} {lm.dtype_name}, {torch.get_num_threads()} threads, {capabilities.detect().summary()}; "
        f"context {args.context}, {args.rounds} rounds of {args.steps} steps")
    rows, gains = {}, []
    for name in args.variants or ("int8w8a+head", "int4w8a+head8"):
        variant, runner = build(lm, name)
        plan = runner.plan
        if plan.w8a_form is None or not plan.cpp_rows:
            out(f"{name:>14}: skipped (no integer kernels in the C++ layer loop here: form {plan.w8a_form})")
            continue
        kind = variant.model.blocks[0].qkv.KIND  # the layers' (a head may be another kind: it keeps the plan's)
        arms = {True: tuple(sorted(set(plan.w8a_hardware_stream) - {kind})),
                False: tuple(sorted(set(plan.w8a_hardware_stream) | {kind}))}
        models = {fetch: Stepper(runner if hw == plan.w8a_hardware_stream else
                                 Runner(variant.model, dataclasses.replace(plan, w8a_hardware_stream=hw)))
                  for fetch, hw in arms.items()}
        times = step_times(models, args.context, args.rounds, args.steps, lm.device)
        r = paired_ratio(times[True], times[False], args.rounds, args.steps)  # > 1: the prefetch's steps were faster
        planned = kind not in plan.w8a_hardware_stream  # the plan's choice: True, the prefetch
        chosen = "prefetch 4 KB ahead" if planned else "hardware prefetchers"
        gains.append(r["ratio"] if planned else 1 / r["ratio"])  # the plan's choice against the other
        rows[name] = {"kind": cpu_qdot.KIND_NAMES[kind], "plan": chosen, "prefetch_ms": round(median(times[True]) * 1e3, 3),
                      "hardware_ms": round(median(times[False]) * 1e3, 3), "prefetch_speedup": r}
        ci = f"95% interval {r['ci95'][0]}-{r['ci95'][1]}" if r["ci95"] else "no interval under 3 rounds"
        out(f"{name:>14}: {cpu_qdot.KIND_NAMES[kind]} layers, the plan's choice {chosen}; step "
            f"{rows[name]['prefetch_ms']:.3f} ms with the prefetch, {rows[name]['hardware_ms']:.3f} ms without: "
            f"the prefetch {r['ratio']:.3f}x as fast ({ci})")
    # ratio: how many times as fast the plan's choice ran as the other, the least over the variants (< 1: it lost)
    return {"prefetch": rows, "context": args.context, "ratio": round(min(gains), 3) if gains else None}


def step_times(models: dict, context: int, rounds: int, steps: int, device) -> dict[str, list[float]]:
    """Seconds of single decode steps at `context` cached tokens, per model-like (`new_cache`,
    `forward(ids, cache)`: a runner, a bench Stepper), the models taking
    turns round after round, in the reverse order every other round, so that none always follows the
    same one and each sees the same machine state (the cache is cropped back
    after each step, so every step has the same context). Each step lies between two done-stamps
    on `device` (engine/core/clock.py): the work, not its launch."""
    ids = torch.arange(100, 100 + context, device=device)
    caches = {}
    for name, m in models.items():
        caches[name] = m.new_cache(context + 2)
        m.forward(ids, caches[name])
    times = {name: [] for name in models}
    turns = list(models.items())
    for r in range(rounds):  # counterbalanced: each round reverses the last one's order (ABC, CBA, ...)
        for name, m in turns if r % 2 == 0 else turns[::-1]:
            for _ in range(steps):
                t0 = clock.done_s(device)
                m.forward(ids[:1], caches[name])
                times[name].append(clock.done_s(device) - t0)
                caches[name].crop(context)
    return times


def paired_ratio(a: list[float], b: list[float], rounds: int, steps: int, scale: float = 1.0) -> dict:
    """How many times faster model a's steps ran than model b's, round by round (step_times' lists:
    `rounds` rounds of `steps` steps each, the models in turn), times `scale`: each round's ratio of the
    two medians (the same minutes of the machine for both), then the one paired estimate over the rounds
    (engine/measure/paired.py: the order-adjusted geometric mean and its 95% t-interval). step_times
    reverses the models' order every other round, so the even and the odd rounds are the crossover's two
    orders and an order effect cancels. A drift of the machine between rounds moves both models of a round
    alike and leaves their ratio; the interval says how far the rounds disagree. Under 3 rounds the
    interval is unknown (None); rounds that all agree give an interval of no width."""
    import math

    from engine.measure import paired

    per_round = [scale * median(b[r * steps:(r + 1) * steps]) / median(a[r * steps:(r + 1) * steps])
                 for r in range(rounds)]
    e = paired.estimate([math.log(x) for x in per_round], ["AB" if r % 2 == 0 else "BA" for r in range(rounds)])
    ci = None if e.method == "none" else [round(math.exp(e.lo), 3), round(math.exp(e.hi), 3)]
    return {"ratio": round(math.exp(e.log_ratio), 3), "ci95": ci, "rounds": rounds,
            "per_round": [round(x, 3) for x in per_round]}
