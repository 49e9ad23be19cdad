"""KV cache precision (`python -m engine.bench kv --kv-dtypes fp16,bf16,int8`): quality against the model-dtype
cache over the long prompt set, and decode speed after a short and after a ~1,400-token prompt, side by side.

The long prompt set (engine/bench/long_prompts.py): the bakery notes four times over (a ~1,400-token chat
history), each closed by one of LONG_ASKS. Per precision (the kv_cache_dtype toggle) and prompt:
  greedy_agreement   the greedy reply's tokens equal to the model-dtype cache's before the two part, over
                     the model-dtype reply's tokens (ui/compare/replies.py's token agreement); `identical` counts
                     replies equal token for token
  top1_agreement     teacher-forced: the model-dtype reply run through a cache of this precision in one
                     forward; the share of its positions whose top-1 token is the model-dtype cache's
Speed: one decode step at a time, as `bench bandwidth` times them (between two done-stamps of the one
clock; the cache cropped back after each, so every step has the same context): per precision a cache
holding a short chat prompt and one holding the first long prompt, then rounds of, per precision in turn,
`--steps` steps after the short prompt and as many after the long one. Many short samples alternating
over precisions and contexts: what a shared machine's load disturbs least. `decode_tps` = 1 / the median
step; `long_vs_short` = long / short decode per precision (the issue's target for int8: >= 0.9), and
`long_vs_model_long` = this precision's long decode / the model-dtype cache's, each the median over rounds
of the round's own ratio (paired: the two figures of a ratio are taken moments apart, so a load that comes
and goes between rounds cancels out of it). The same from the process's CPU time per step
(`*_cpu`: with `--threads 1` the step's own work, which a neighbour on the cores delays far less than the
wall clock; prefill_chunks reads it the same way). `mb_per_step`:
what a step reads at the long prompt's context (weights + KV at that precision: bandwidth.bytes_read_per_step,
the roofline's count). `bytes_bound`: the long_vs_short a step would reach streaming the KV as fast as its
weights (bytes at the short context over bytes at the long one; `bytes_bound` below says why it is no hard
limit). `ratio`: int8's long_vs_short (or the last precision's).
`--python-loop`: each precision timed too through a runner whose plan was made with the layers switch off
(`PRECISION python loop` rows, in the same rounds), and the plan's loop over the Python one, paired: what the
C++ layer loop (engine/kernels/cpu_layers.py) buys at each precision, short and long.
"""

from __future__ import annotations

import torch

from engine.cli import comma_list
from engine.bench import CHAT_PROMPTS, Stepper, load_model, median, run_request
from engine.core import clock
from engine.bench.long_prompts import LONG_ASKS, long_prompts

PY = "python loop"  # --python-loop's label suffix

def add_args(p):
    p.add_argument("--kv-dtypes", default="", type=comma_list(),
                   help="also (instead of the KV reuse run) compare these KV cache precisions with the model's "
                        "dtype, e.g. fp16,bf16,int8: quality over the long prompt set and decode speed short vs long")
    p.add_argument("--prompts-long", type=int, default=len(LONG_ASKS), help="long prompts in the quality set")
    p.add_argument("--rounds", type=int, default=5, help="alternating speed rounds (0: quality only)")
    p.add_argument("--steps", type=int, default=6, help="decode steps per precision and context per round")
    p.add_argument("--no-quality", action="store_true", help="speed only: no replies, no agreement figures")
    p.add_argument("--weights", default=None, help="a weights variant to run (default: the loaded model)")
    p.add_argument("--python-loop", action="store_true",
                   help="also time each precision with the layers in Python (a plan made with the layers switch "
                        "off), alternating with the plan's own loop: what the C++ loop buys at each precision")


def run(args, out):
    from engine.bench.bandwidth import bytes_read_per_step
    from engine.core.config import GenerationConfig
    from engine.kernels import switches
    from engine.platform import capabilities
    from engine.runtime.plan import make_plan
    from engine.runtime.runner import Runner
    from engine.serving.generate import build_prompt_ids
    from engine.serving.variants import VariantSet

    lm = load_model(args)
    variants = VariantSet(lm, budget_bytes=10**13, quality_texts=0)
    variant = variants.get(args.weights) if args.weights else variants.default
    runner = variant.runner
    kinds = ["model"] + [k for k in args.kv_dtypes if k != "model"]
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=args.last_tokens, kv_reuse=False)
    for kv in kinds:
        greedy.replace(kv_cache_dtype=kv)  # a precision the toggle does not take fails here, before any work
    prompts = long_prompts(args.prompts_long)
    ids = [build_prompt_ids(lm.tokenizer, p) for p in prompts]
    out(f"machine: {capabilities.detect().summary()}; {torch.get_num_threads()} threads")
    out(f"model {lm.name} {variant.name} on {lm.device}; KV precisions {kinds}; long prompts of "
        f"{min(map(len, ids))}-{max(map(len, ids))} tokens, replies of {args.last_tokens} tokens")
    out(f"decode attention: model-dtype cache {runner.plan.attention_text}; others {runner.plan.kv_attention_text}")

    replies = {} if args.no_quality else {kv: [run_request(lm, None, greedy.replace(kv_cache_dtype=kv), prompt_ids=p, runner=runner).token_ids
                    for p in ids] for kv in kinds}
    def top1(p, ref, kv):  # the model-dtype reply forced through a cache of precision kv: each position's top-1
        forced = torch.tensor(p + ref, device=lm.device)
        with torch.inference_mode():
            return runner.forward(forced, runner.new_cache(len(forced), kv), all_logits=True)[len(p) - 1: -1].argmax(-1)

    reference = [top1(p, ref, "model") for p, ref in zip(ids, replies["model"])] if replies else []
    quality = {kv: {} for kv in kinds}
    for kv in kinds if replies else ():
        common = total = identical = agree = positions = 0
        for p, ref, got, want in zip(ids, replies["model"], replies[kv], reference):
            part = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            common, total, identical = common + part, total + len(ref), identical + (ref == got)
            agree += int((want == (top1(p, ref, kv) if kv != "model" else want)).sum())
            positions += len(ref)
        quality[kv] = {"greedy_agreement": round(common / total, 4) if total else None, "identical": identical,
                       "replies": len(ids), "top1_agreement": round(agree / positions, 4) if positions else None,
                       "positions": positions}

    short_ids = build_prompt_ids(lm.tokenizer, [{"role": "user", "content": CHAT_PROMPTS[0]}])
    steppers = {kv: Stepper(runner, kv=kv) for kv in kinds}
    if args.python_loop:
        with switches.forced_off("layers"):  # a plan made with the switch off: its layers in Python
            py = Runner(runner.model, make_plan(runner.model, cache_dir=lm.cache_dir, weights=variant.name))
        out(f"also timed: the layers in {py.plan.layer_loop_text}, against {runner.plan.layer_loop_text}")
        steppers.update({f"{kv} {PY}": Stepper(py, kv=kv) for kv in kinds})
    speed, cpu = step_speeds(steppers, {"short": short_ids, "long": ids[0]}, args.rounds, args.steps, out)
    rows = {}
    context = len(ids[0]) + args.last_tokens // 2
    for label, stepper in steppers.items() if speed else ():
        kv, t, c = stepper.kv, speed[label], cpu[label]
        model = "model" + label[len(kv):]  # the model-dtype cache through the same loop
        long_bytes, weight_bytes = (bytes_read_per_step(runner.model, n, kv) for n in (context, 0))
        rows[label] = {**(quality[kv] if label == kv else {}),
                       "decode_tps_short": round(1 / median(t["short"]), 1),
                       "decode_tps_long": round(1 / median(t["long"]), 1),
                       "long_vs_short": round(paired(t["short"], t["long"], args.steps), 3),
                       "long_vs_model_long": round(paired(speed[model]["long"], t["long"], args.steps), 3),
                       "long_vs_short_cpu": round(paired(c["short"], c["long"], args.steps), 3),
                       "long_vs_model_long_cpu": round(paired(cpu[model]["long"], c["long"], args.steps), 3),
                       "cpu_ms_short": round(1e3 * median(c["short"]), 2),
                       "cpu_ms_long": round(1e3 * median(c["long"]), 2),
                       "mb_per_step_long": round(long_bytes / 1e6, 1),
                       "kv_mb_long": round((long_bytes - weight_bytes) / 1e6, 1),
                       "bytes_bound": round(bytes_bound(runner.model, len(short_ids), len(ids[0]), kv), 3)}
    for kv in list(steppers) if speed else kinds:
        q = rows[kv] if kv in rows else rows.setdefault(kv, dict(quality[kv]))
        parts = [f"greedy agreement {q['greedy_agreement']:.1%} ({q['identical']} of {q['replies']} replies "
                 f"identical), top-1 {q['top1_agreement']:.1%} over {q['positions']} positions"] \
            if replies and kv in kinds else []
        if speed:
            parts.append(f"decode {q['decode_tps_short']:.1f} tok/s short, {q['decode_tps_long']:.1f} after "
                         f"{len(ids[0])} tokens = {q['long_vs_short']:.2f}x (bytes bound {q['bytes_bound']:.2f}x; "
                         f"{q['long_vs_model_long']:.2f}x model-dtype KV's long); CPU time a step {q['cpu_ms_short']:.1f} ms short, {q['cpu_ms_long']:.1f} ms long = "
                         f"{q['long_vs_short_cpu']:.2f}x ({q['long_vs_model_long_cpu']:.2f}x model-dtype KV's long); a long "
                         f"step reads {q['mb_per_step_long']:.1f} MB, {q['kv_mb_long']:.1f} MB of it KV")
        out(f"{kv:>6}: " + "; ".join(parts))
    if args.python_loop and speed:
        out("plan's loop / Python loop, decode speed (paired medians): " + ", ".join(
            f"{kv} {paired(speed[f'{kv} {PY}'][n], speed[kv][n], args.steps):.2f}x {n}" for kv in kinds
            for n in ("short", "long")))
    key = "int8" if "int8" in rows else kinds[-1]
    return {"kv_dtypes": rows, "ratio": rows[key].get("long_vs_short"), "bytes_bound": rows[key].get("bytes_bound"),
            "steps": args.steps,
            "weights": variant.name, "dtype": lm.dtype_name,
            "long_prompt_tokens": [len(p) for p in ids], "short_prompt_tokens": len(short_ids),
            "max_new_tokens": args.last_tokens, "rounds": args.rounds, "threads": torch.get_num_threads(),
            "capabilities": capabilities.detect().summary(), "kv_attention": runner.plan.kv_attention_text}


def step_speeds(steppers: dict, prompts: dict, rounds: int, steps: int, out) -> dict:
    """Seconds of one decode step per stepper (a runner and a cache precision, by label) and prompt
    ({label: {name: [s, ...]}}): a cache per (label, prompt) prefilled once, then `rounds` of `steps` steps
    through each in turn, the cache cropped back after each step; and the process's CPU time of each. ({}, {})
    for 0 rounds."""
    import time

    if rounds <= 0:
        return {}, {}
    kinds = list(steppers)
    device = next(iter(steppers.values())).runner.device
    held = {}
    for kv, stepper in steppers.items():
        for name, ids in prompts.items():
            cache = stepper.new_cache(len(ids) + 2)
            stepper.forward(torch.tensor(ids, device=device), cache)
            held[kv, name] = (stepper, cache, len(ids))
    times = {kv: {name: [] for name in prompts} for kv in kinds}
    cpu = {kv: {name: [] for name in prompts} for kv in kinds}
    token = torch.tensor([100], device=device)
    for r in range(rounds):
        for (kv, name), (stepper, cache, n) in held.items():  # alternating precisions and contexts, round after round
            for _ in range(steps):
                t0, c0 = clock.done_s(device), time.process_time()
                stepper.forward(token, cache)
                times[kv][name].append(clock.done_s(device) - t0)
                cpu[kv][name].append(time.process_time() - c0)
                cache.crop(n)
        out(f"  round {r + 1}/{rounds}: decode step ms short/long " + ", ".join(
            f"{kv} {1e3 * median(times[kv]['short'][-steps:]):.1f}/{1e3 * median(times[kv]['long'][-steps:]):.1f}"
            for kv in kinds))
    return times, cpu


def bytes_bound(model, short: int, long: int, kv: str) -> float:
    """The long/short decode ratio a step would reach if it streamed the KV as fast as it streams its weights:
    the bytes a step reads at `short` tokens of context over those at `long` (bandwidth.bytes_read_per_step,
    the roofline's count: weights and scales, the KV at precision `kv`). With W the weight bytes, ~W / (W + KV):
    the smaller the weights, the lower it lies (int4 weights with an int8 KV at ~1,400 tokens: ~0.85). A ratio
    above it means the attention streams the KV faster than the step streams its weights, not a wrong count."""
    from engine.bench.bandwidth import bytes_read_per_step

    return bytes_read_per_step(model, short, kv) / bytes_read_per_step(model, long, kv)


def paired(a: list[float], b: list[float], steps: int) -> float:
    """The median over rounds of (round's median a) / (round's median b): step times a and b taken in the same
    rounds, `steps` a round. For times, a / b is b's speed over a's."""
    rounds = range(0, len(a), steps)
    return median([median(a[i : i + steps]) / median(b[i : i + steps]) for i in rounds])
