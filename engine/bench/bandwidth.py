"""Memory bandwidth of this machine vs the bandwidth a decode step achieves.

Decode reads every weight once per token, so weight bytes x decode tok/s is the bandwidth the
loop achieves (KV reads are left out: small for short prompts). The machine's figure is a large
tensor copy (bytes read + bytes written, as STREAM counts it), with the same thread count.
"""

from __future__ import annotations

import time

import torch

from . import CHAT_PROMPTS, load_model, median, run_request


def add_args(p):
    p.add_argument("--copy-mb", type=int, default=1024, help="size of the tensor copied")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)


def copy_bandwidth(mb: int, runs: int = 7) -> float:
    """GB/s of dst.copy_(src) for an `mb`-MB tensor, counting read + write."""
    n = mb * 1024 * 1024 // 4
    src, dst = torch.ones(n), torch.empty(n)
    dst.copy_(src)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * n * 4 / median(times) / 1e9


def run(args, out):
    from ..config import GenerationConfig

    lm = load_model(args)
    threads = torch.get_num_threads()
    machine = copy_bandwidth(args.copy_mb)
    out(f"memory copy bandwidth ({threads} threads, {args.copy_mb} MB): {machine:.1f} GB/s")
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    tps = []
    for i in range(args.runs):
        done = run_request(lm, [{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}], gen)
        tps.append(done.timeline.decode_tps)
    decode_tps = median(tps)
    wbytes = lm.weight_bytes()
    achieved = wbytes * decode_tps / 1e9
    out(f"decode {decode_tps:.1f} tok/s x {wbytes / 1e6:.0f} MB of weights ({lm.dtype_name}) = {achieved:.1f} GB/s "
        f"achieved, {achieved / machine:.0%} of the copy bandwidth")
    return {"copy_gbps": round(machine, 2), "decode_tps": decode_tps, "weight_bytes": wbytes,
            "achieved_gbps": round(achieved, 2), "ratio": round(achieved / machine, 3), "dtype": lm.dtype_name,
            "threads": threads}
