"""`python -m engine.bench limits [--device cuda] [--dtypes fp32,bf16] [--force]`: this machine's limits
(engine/measure/machine_limits.py: read and copy bandwidth, matmul peaks), from its cache or probed now."""

from __future__ import annotations

import json

from engine.cli import comma_list
from engine.measure.machine_limits import ROUNDS, load_or_measure, probe_dtypes


def add_args(p) -> None:
    p.add_argument("--dtypes", default=None, type=comma_list(),
                   help="matmul dtypes (default: fp32, and bf16 where the device has it)")
    p.add_argument("--seconds", type=float, default=3.0, help="the probe's budget, all rounds together")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds of each figure (the best counts)")
    p.add_argument("--force", action="store_true", help="measure again even if cached")
    p.add_argument("--no-cache", action="store_true", help="measure, and write nothing")


def run(args, out) -> dict:
    import torch

    from engine.cli import load_config_from_args
    from engine.model.loader import cache_root
    from engine.platform.device import choose

    if args.threads:
        torch.set_num_threads(args.threads)
    device = choose(args.device).device
    root = None if args.no_cache else cache_root(load_config_from_args(args, progress=False))
    dtypes = tuple(args.dtypes) if args.dtypes else probe_dtypes("fp32", device)
    limits = load_or_measure(root, device, dtypes, force=args.force, seconds=args.seconds, rounds=args.rounds)
    if not args.json:
        out(json.dumps(limits.to_dict(), indent=1))
    out(limits.summary(), f"· probe {limits.probe_s:.2f} s")
    return limits.to_dict()
