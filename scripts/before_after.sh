#!/usr/bin/env bash
# Before/after, alternating (ABBA per variant and context), one JSON line per run into OUT:
#   scripts/before_after.sh BEFORE_CHECKOUT AFTER_CHECKOUT [OUT]
# Each checkout needs a .venv (a link to one is fine). VARIANTS (default "fp32 int4wo+head") and
# REPEATS (prompt repeats: 1 ~ 40 tokens, 24 ~ 1,350 tokens; default "1 24") override.
set -euo pipefail
before=$(realpath "$1"); after=$(realpath "$2"); out=${3:-before_after.jsonl}; : > "$out"
probe=$(realpath "$(dirname "$0")/decode_cost.py")
for v in ${VARIANTS:-fp32 int4wo+head}; do for rep in ${REPEATS:-1 24}; do
  for tree in "$before" "$after" "$after" "$before"; do
    (cd "$tree" && TORCH_EXTENSIONS_DIR="$tree/.torch_extensions" .venv/bin/python "$probe" "$v" 33 "$rep" | tail -1) >> "$out"
  done
done; done
