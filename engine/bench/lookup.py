"""Prompt-lookup speculation on copy-heavy prompts (edit, summarise with quotes, rewrite code),
and, as the guard rail, on open-ended chat prompts where there is little to copy."""

from __future__ import annotations

from engine.bench import load_model
from engine.bench.spec_prompts import DRAFT_PROMPTS, LOOKUP_PROMPTS
from engine.bench.speculation import add_common_args, compare, header


def add_args(p):
    add_common_args(p, k_default=8)
    p.add_argument("--skip-open-ended", action="store_true", help="only the copy-heavy prompts")


def run(args, out):
    lm = load_model(args)
    header(lm, args, out, "speculative=prompt_lookup")
    n = args.prompts or None
    out("copy-heavy prompts:")
    result = compare(lm, LOOKUP_PROMPTS[:n], "prompt_lookup", args, out, "copy-heavy")
    if not args.skip_open_ended:
        out("open-ended prompts (little to copy; adaptive k should keep the ratio near 1):")
        open_ended = compare(lm, DRAFT_PROMPTS[:n], "prompt_lookup", args, out, "open-ended")
        result["open_ended"] = open_ended
        result["open_ended_ratio"] = open_ended["ratio"]
        result["identical"] = result["identical"] and open_ended["identical"]
    result.update(dtype=lm.dtype_name, k=args.k, adaptive=not args.no_adaptive, max_new_tokens=args.max_new_tokens)
    return result
