"""Our decode loop vs transformers `generate`: same weights, same dtype, greedy, same prompts.

Runs alternate (ours, generate, ours, ...) in one process. Decode tok/s is measured the same
way for both: (tokens - 1) / (last token time - first token time); generate's token times come
from a streamer. `identical` says whether every prompt gave the same token ids.
"""

from __future__ import annotations

import torch

from engine.bench import CHAT_PROMPTS, load_model, median, run_request
from engine.core import clock


def add_args(p):
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="alternating runs per prompt")
    p.add_argument("--prompts", type=int, default=len(CHAT_PROMPTS))


class _TokenTimes:
    """A transformers streamer that stamps each generated token (the first put is the prompt), once
    the token is on the device it was computed on (the clock's done-stamp), as our Timeline does."""

    def __init__(self):
        self.times: list[int] = []
        self._prompt_seen = False

    def put(self, value):
        if self._prompt_seen:
            self.times.append(clock.done_ns(value))
        self._prompt_seen = True

    def end(self):
        pass


def _generate_run(ref, tokenizer, prompt_ids, eos, n):
    streamer = _TokenTimes()
    ids = torch.tensor([prompt_ids], device=ref.device)
    with torch.inference_mode():
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                           streamer=streamer, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0],
                           temperature=None, top_p=None, top_k=None)
    new = out[0, len(prompt_ids):].tolist()
    t = streamer.times
    tps = (len(t) - 1) / ((t[-1] - t[0]) / 1e9) if len(t) > 1 and t[-1] > t[0] else None
    return new, tps


def run(args, out):
    from engine.core.config import GenerationConfig
    from engine.model.loader import load_reference
    from engine.serving.generate import build_prompt_ids

    lm = load_model(args)
    ref = load_reference(lm)
    out(f"model {lm.name} {lm.dtype_name} on {lm.device}, {torch.get_num_threads()} threads, "
        f"fast path {lm.fast_path}; {args.max_new_tokens} new tokens, {args.runs} alternating runs per prompt")
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    ours_tps, ref_tps, identical, per_prompt = [], [], True, []
    for prompt in CHAT_PROMPTS[: args.prompts]:
        messages = [{"role": "user", "content": prompt}]
        prompt_ids = build_prompt_ids(lm.tokenizer, messages)
        o_runs, r_runs = [], []
        for _ in range(args.runs):
            done = run_request(lm, messages, gen)
            o_runs.append(done.timeline.decode_tps)
            ref_ids, tps = _generate_run(ref, lm.tokenizer, prompt_ids, lm.eos_token_ids, args.max_new_tokens)
            r_runs.append(tps)
            same = done.token_ids == ref_ids
            identical &= same
        ours_tps += o_runs
        ref_tps += r_runs
        per_prompt.append({"prompt": prompt[:40], "ours_tps": median(o_runs), "generate_tps": median(r_runs),
                           "tokens": len(done.token_ids), "identical": same})
        out(f"  {prompt[:40]:<42} ours {median(o_runs):6.1f} tok/s   generate {median(r_runs):6.1f} tok/s"
            f"   {len(done.token_ids)} tokens   identical {same}")
    ours, theirs = median(ours_tps), median(ref_tps)
    out(f"median decode tok/s: ours {ours:.1f}, generate {theirs:.1f}, ratio {ours / theirs:.2f}, identical {identical}")
    return {"ours_decode_tps": ours, "generate_decode_tps": theirs, "ratio": round(ours / theirs, 3),
            "identical": identical, "dtype": lm.dtype_name, "threads": torch.get_num_threads(),
            "max_new_tokens": args.max_new_tokens, "runs": args.runs, "per_prompt": per_prompt}
