"""One decode step per quantization variant, every variant alternating in one process: the decode
ratio of each variant over the loaded model without whole replies (quick where `quant` is slow)."""

from __future__ import annotations

import torch

from engine.bench import load_model, median
from engine.core import clock

DEFAULT_VARIANTS = "int8wo,int8wo+head,int4wo,int4wo+head,nf4"  # --variants (a load flag) overrides


def add_args(p):
    p.add_argument("--context", type=int, default=64, help="tokens already in the cache")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="decode steps per variant per round")


def run(args, out):
    from engine.bench import Stepper, runner_for
    from engine.platform import capabilities
    from engine.serving.variants import build

    lm = load_model(args)
    models = {lm.dtype_name: Stepper(runner_for(lm))}
    for name in [v.strip() for v in (args.variants or DEFAULT_VARIANTS).split(",") if v.strip()]:
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
