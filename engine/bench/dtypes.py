"""Prefill and decode speed, and quality, per dtype: the measurement behind `--dtype auto`.

Quality is measured against fp32 on a fixed text: top-1 agreement and mean KL(fp32 || dtype)
of the next-token distributions over 64 positions (teacher forcing).
"""

from __future__ import annotations

import torch

from engine.cli import comma_list
from engine.bench import CHAT_PROMPTS, load_model, median, run_request
from engine.core import clock

TEXT = ("The printing press changed how knowledge spread across Europe. Before it, books were copied by hand, "
        "slowly and at great cost, and few people could read. ") * 40


def add_args(p):
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dtypes", default="fp32,bf16,fp16", type=comma_list())


def run(args, out):
    from engine.bench import runner_for
    from engine.core.config import GenerationConfig

    results, ref_logits = {}, None
    for name in args.dtypes:
        lm = load_model(args, dtype=name)
        model = runner_for(lm)
        ids = torch.tensor(lm.tokenizer(TEXT)["input_ids"][: args.prefill_tokens], device=lm.device)
        prefill = []
        for _ in range(args.runs):
            cache = model.new_cache(len(ids))
            t = clock.done_s(lm.device)
            model.forward(ids, cache)
            prefill.append(clock.done_s(lm.device) - t)
        logits = model.forward(ids[:64], model.new_cache(64), all_logits=True)
        if ref_logits is None:
            ref_logits = logits
        ref_logp, logp = ref_logits.log_softmax(-1), logits.log_softmax(-1)
        kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1).mean().item()
        agree = (ref_logits.argmax(-1) == logits.argmax(-1)).float().mean().item()
        gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
        decode = [run_request(lm, [{"role": "user", "content": CHAT_PROMPTS[i % 5]}], gen).timeline.decode_tps
                  for i in range(args.runs)]
        results[name] = {"prefill_tps": round(len(ids) / median(prefill), 1), "decode_tps": round(median(decode), 1),
                         "top1_vs_fp32": round(agree, 4), "kl_vs_fp32": kl}
        r = results[name]
        out(f"{name:>5}: prefill {r['prefill_tps']:7.1f} tok/s ({len(ids)} tokens)  decode {r['decode_tps']:5.1f} tok/s"
            f"  top-1 vs fp32 {agree:.1%}  KL {kl:.2e}")
        del lm, model
    base = results.get("fp32")
    ratio = None
    if base and "bf16" in results:
        ratio = round(results["bf16"]["decode_tps"] / base["decode_tps"], 2)
    return {"dtypes": results, "ratio": ratio, "threads": torch.get_num_threads()}
