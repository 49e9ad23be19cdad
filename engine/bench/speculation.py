"""Shared by the `lookup` and `draft` scenarios: decode speed with speculation on vs off.

For each prompt, runs alternate (off, on, off, on, ...) in one process; decode tok/s is the
glossary's `decode_tps` (first to last token sampled). A prompt's ratio is its median on / median
off; `ratio` is the geometric mean of the prompts' ratios (the usual mean of speedups: each prompt
counts once, however fast it decodes), `worst_ratio` the lowest. `identical` says whether every
greedy output with speculation equals the one without.
"""

from __future__ import annotations

import math

import torch

from engine.bench import median, run_request


def add_common_args(p, k_default: int):
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="alternating runs per prompt and variant")
    p.add_argument("--k", type=int, default=k_default, help="num_speculative_tokens (the most guessed per step)")
    p.add_argument("--no-adaptive", action="store_true", help="guess k tokens every step")
    p.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0: all)")


def compare(lm, prompts, mode: str, args, out, label: str) -> dict:
    from engine.core.config import GenerationConfig

    off = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    on = off.replace(speculative=mode, num_speculative_tokens=args.k, speculative_adaptive=not args.no_adaptive)
    off_tps, on_tps, identical, per_prompt = [], [], True, []
    drafted = accepted = steps_tokens = steps = 0
    hist = [0] * (args.k + 1)
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        o_runs, s_runs = [], []
        for _ in range(args.runs):
            base = run_request(lm, messages, off)
            spec = run_request(lm, messages, on)
            o_runs.append(base.timeline.decode_tps)
            s_runs.append(spec.timeline.decode_tps)
            same = base.token_ids == spec.token_ids
            identical &= same
        c = spec.timeline.counters.speculation
        drafted, accepted = drafted + c.drafted, accepted + c.accepted
        hist = [a + b for a, b in zip(hist, c.accepted_hist)]
        steps += c.target_forward_passes - 1
        steps_tokens += spec.output_tokens - 1
        off_tps += o_runs
        on_tps += s_runs
        row = {"prompt": prompt[:48], "off_tps": median(o_runs), "on_tps": median(s_runs),
               "ratio": round(median(s_runs) / median(o_runs), 3), "tokens": spec.output_tokens, "identical": same,
               "acceptance_rate": c.acceptance_rate, "tokens_per_step": c.tokens_per_step, "backoffs": c.backoffs}
        per_prompt.append(row)
        out(f"  {prompt[:44].replace(chr(10), ' '):<46} off {row['off_tps']:6.1f}  on {row['on_tps']:6.1f} tok/s  "
            f"ratio {row['ratio']:.2f}  accept {c.acceptance_rate if c.acceptance_rate is not None else 'n/a'}  "
            f"tok/step {c.tokens_per_step}  {row['tokens']} tok  identical {same}")
    ratio = math.exp(sum(math.log(r["ratio"]) for r in per_prompt) / len(per_prompt))
    rate = accepted / drafted if drafted else None
    costs = c.cost_model or {}
    out(f"{label}: cost model (plain steps, measured once per process): verify = 1 + {costs.get('verify_fixed')} "
        f"+ {costs.get('verify_per_token')} x k, measured (T, steps) {costs.get('verify_steps')}, draft token "
        f"{costs.get('draft_cost')}, step {costs.get('step_ms')} ms")
    out(f"{label}: decode tok/s off {median(off_tps):.1f}, on {median(on_tps):.1f}, ratio {ratio:.2f} (geometric mean; "
        f"worst prompt {min(r['ratio'] for r in per_prompt):.2f}), "
        f"acceptance {rate if rate is None else round(rate, 3)}, tokens/step {steps_tokens / max(steps, 1):.2f}, "
        f"accepted-per-step histogram {hist}, identical {identical}")
    return {"off_decode_tps": median(off_tps), "on_decode_tps": median(on_tps), "ratio": round(ratio, 3),
            "worst_ratio": min(r["ratio"] for r in per_prompt),
            "identical": identical, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": round(rate, 4) if rate is not None else None,
            "tokens_per_step": round(steps_tokens / max(steps, 1), 3), "accepted_hist": hist, "per_prompt": per_prompt,
            "cost_model": costs}


def header(lm, args, out, what: str) -> None:
    draft = lm.draft.info()["name"] if getattr(lm, "draft", None) else "none"
    out(f"model {lm.name} {lm.dtype_name} on {lm.device}, {torch.get_num_threads()} threads; {what}; k={args.k}, "
        f"adaptive {not args.no_adaptive}; {args.max_new_tokens} new tokens, greedy; {args.runs} alternating runs "
        f"per prompt; draft: {draft}")
