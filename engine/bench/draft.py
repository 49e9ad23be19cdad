"""Draft-model speculation on ordinary (open-ended) chat prompts: the bundled distilled draft by
default, or --draft-model PATH."""

from __future__ import annotations

from engine.bench import load_model
from engine.bench.spec_prompts import DRAFT_PROMPTS
from engine.bench.speculation import add_common_args, compare, header


def add_args(p):
    add_common_args(p, k_default=4)


def run(args, out):
    lm = load_model(args)
    if lm.draft is None:
        raise SystemExit("no draft model is loaded: pass --draft-model PATH (the bundled model has one built in)")
    header(lm, args, out, "speculative=draft")
    result = compare(lm, DRAFT_PROMPTS[: args.prompts or None], "draft", args, out, "open-ended chat")
    result.update(dtype=lm.dtype_name, k=args.k, adaptive=not args.no_adaptive, max_new_tokens=args.max_new_tokens,
                  draft=lm.draft.info())
    return result
