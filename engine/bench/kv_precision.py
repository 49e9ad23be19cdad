"""KV cache precision (`python -m engine.bench kv --kv-dtypes fp16,bf16,int8`): quality against the model-dtype
cache over the long prompt set, and decode speed after a short and after a ~1,400-token prompt, side by side.

The long prompt set (engine/bench/long_prompts.py): the bakery notes four times over (a ~1,400-token chat
history), each closed by one of LONG_ASKS. Per precision (the kv_cache_dtype toggle) and prompt:
  greedy_agreement   the greedy reply's tokens equal to the model-dtype cache's before the two part, over
                     the model-dtype reply's tokens (ui/replies.py's token agreement); `identical` counts
                     replies equal token for token
  top1_agreement     teacher-forced: the model-dtype reply run through a cache of this precision in one
                     forward; the share of its positions whose top-1 token is the model-dtype cache's
Speed: rounds of, per precision in turn, one greedy reply to a short chat prompt and one to the first long
prompt (KV reuse off: the whole prompt prefilled), `decode_tps` from each reply's Timeline; medians, and
`long_vs_short` = long / short decode per precision (the issue's target for int8: >= 0.9). `mb_per_step`:
what a step reads at the long prompt's context (weights + KV at that precision: bandwidth.bytes_read_per_step,
the roofline's count). `ratio`: int8's long_vs_short (or the last precision's).
"""

from __future__ import annotations

import torch

from engine.bench import CHAT_PROMPTS, load_model, median, run_request
from engine.bench.long_prompts import LONG_ASKS, long_prompts

def add_args(p):
    p.add_argument("--kv-dtypes", default="",
                   help="also (instead of the KV reuse run) compare these KV cache precisions with the model's "
                        "dtype, e.g. fp16,bf16,int8: quality over the long prompt set and decode speed short vs long")
    p.add_argument("--prompts-long", type=int, default=len(LONG_ASKS), help="long prompts in the quality set")
    p.add_argument("--rounds", type=int, default=3, help="alternating speed rounds (short and long reply per precision)")
    p.add_argument("--weights", default=None, help="a weights variant to run (default: the loaded model)")


def run(args, out):
    from engine.bench.bandwidth import bytes_read_per_step
    from engine.core.config import GenerationConfig
    from engine.platform import capabilities
    from engine.serving.generate import build_prompt_ids
    from engine.serving.variants import VariantSet

    lm = load_model(args)
    variants = VariantSet(lm, budget_bytes=10**13, quality_texts=0)
    variant = variants.get(args.weights) if args.weights else variants.default
    runner = variant.runner
    kinds = ["model"] + [k.strip() for k in args.kv_dtypes.split(",") if k.strip() and k.strip() != "model"]
    greedy = GenerationConfig(temperature=0.0, max_new_tokens=args.last_tokens, kv_reuse=False)
    for kv in kinds:
        greedy.replace(kv_cache_dtype=kv)  # a precision the toggle does not take fails here, before any work
    prompts = long_prompts(args.prompts_long)
    ids = [build_prompt_ids(lm.tokenizer, p) for p in prompts]
    out(f"machine: {capabilities.detect().summary()}; {torch.get_num_threads()} threads")
    out(f"model {lm.name} {variant.name} on {lm.device}; KV precisions {kinds}; long prompts of "
        f"{min(map(len, ids))}-{max(map(len, ids))} tokens, replies of {args.last_tokens} tokens")
    out(f"decode attention: model-dtype cache {runner.plan.attention_text}; others {runner.plan.kv_attention_text}")

    replies = {kv: [run_request(lm, None, greedy.replace(kv_cache_dtype=kv), prompt_ids=p, runner=runner).token_ids
                    for p in ids] for kv in kinds}
    quality = {}
    for kv in kinds:
        common = total = identical = agree = positions = 0
        for p, ref, got in zip(ids, replies["model"], replies[kv]):
            part = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            common, total, identical = common + part, total + len(ref), identical + (ref == got)
            forced = torch.tensor(p + ref, device=lm.device)
            with torch.inference_mode():
                logits = {k: runner.forward(forced, runner.new_cache(len(forced), k), all_logits=True)[len(p) - 1: -1]
                          for k in ("model", kv)}
            agree += int((logits["model"].argmax(-1) == logits[kv].argmax(-1)).sum())
            positions += len(ref)
        quality[kv] = {"greedy_agreement": round(common / total, 4) if total else None, "identical": identical,
                       "replies": len(ids), "top1_agreement": round(agree / positions, 4) if positions else None,
                       "positions": positions}

    short_ids = build_prompt_ids(lm.tokenizer, [{"role": "user", "content": CHAT_PROMPTS[0]}])
    speed = {kv: {"short": [], "long": []} for kv in kinds}
    for r in range(args.rounds):
        for kv in kinds:  # alternating: each precision sees the same machine state
            cfg = greedy.replace(kv_cache_dtype=kv)
            speed[kv]["short"].append(run_request(lm, None, cfg, prompt_ids=short_ids, runner=runner).timeline.decode_tps)
            speed[kv]["long"].append(run_request(lm, None, cfg, prompt_ids=ids[0], runner=runner).timeline.decode_tps)
        out(f"  round {r + 1}/{args.rounds}: decode tok/s short/long " + ", ".join(
            f"{kv} {speed[kv]['short'][-1]:.1f}/{speed[kv]['long'][-1]:.1f}" for kv in kinds))
    rows = {}
    context = len(ids[0]) + args.last_tokens // 2
    for kv in kinds:
        short, long = median(speed[kv]["short"]), median(speed[kv]["long"])
        rows[kv] = {**quality[kv], "decode_tps_short": round(short, 1), "decode_tps_long": round(long, 1),
                    "long_vs_short": round(long / short, 3),
                    "long_vs_model_long": round(long / median(speed["model"]["long"]), 3),
                    "mb_per_step_long": round(bytes_read_per_step(runner.model, context, kv) / 1e6, 1),
                    "kv_mb_long": round((bytes_read_per_step(runner.model, context, kv)
                                         - bytes_read_per_step(runner.model, 0, kv)) / 1e6, 1)}
        q = rows[kv]
        out(f"{kv:>6}: greedy agreement {q['greedy_agreement']:.1%} ({q['identical']} of {q['replies']} replies "
            f"identical), top-1 {q['top1_agreement']:.1%} over {q['positions']} positions; decode "
            f"{q['decode_tps_short']:.1f} tok/s short, {q['decode_tps_long']:.1f} after {len(ids[0])} tokens "
            f"= {q['long_vs_short']:.2f}x ({q['long_vs_model_long']:.2f}x model-dtype KV's long); a long step reads "
            f"{q['mb_per_step_long']:.1f} MB, {q['kv_mb_long']:.1f} MB of it KV")
    key = "int8" if "int8" in rows else kinds[-1]
    return {"kv_dtypes": rows, "ratio": rows[key]["long_vs_short"], "weights": variant.name, "dtype": lm.dtype_name,
            "long_prompt_tokens": [len(p) for p in ids], "short_prompt_tokens": len(short_ids),
            "max_new_tokens": args.last_tokens, "rounds": args.rounds, "threads": torch.get_num_threads(),
            "capabilities": capabilities.detect().summary(), "kv_attention": runner.plan.kv_attention_text}
