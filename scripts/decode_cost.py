"""One checkout's decode and prefill cost, for a before/after comparison of two checkouts of this repo
(scripts/before_after.sh runs it in both, alternating). Run from a checkout's root: that checkout's
engine is imported. One variant, 1 thread, greedy; timed by this thread's CPU time (time.thread_time),
which other processes' load does not stretch the way it stretches wall time:
prefill = T(1 new token), decode per token = (T(N new) - T(1 new)) / (N - 1), medians of 3.
Works on checkouts from before and after the execution plan (issue 40): where engine.serving.variants
has `build`, the variant is built with its runner; before, `build_variant` gives its model.
usage: python scripts/decode_cost.py VARIANT N PROMPT_REPEAT  (prints one JSON line)"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch
torch.set_num_threads(1)
from engine.bench import build_parser, load_model, run_request
from engine.core.config import GenerationConfig

variant, n, rep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
argv = ["baseline", "--dtype", "fp32", "--threads", "1"]
args = build_parser(argv)[0].parse_args(argv)
lm = load_model(args)
kw = {}
if variant != "fp32":
    try:  # after issue 40: the variant and its runner, built from its plan
        from engine.serving.variants import build
        lm, kw["runner"] = build(lm, variant)
    except ImportError:  # before: the variant's model
        from engine.quant.quantize import build_variant
        lm = build_variant(lm, variant)
text = ("Explain how a CPU cache works, step by step, with an example. " * rep).strip()
msgs = [{"role": "user", "content": text}]

def cpu(k):
    t0 = time.thread_time()
    d = run_request(lm, msgs, GenerationConfig(max_new_tokens=k, temperature=0.0), **kw)
    return time.thread_time() - t0, d

cpu(4)  # warm-up
one, many = [], []
for _ in range(3):
    one.append(cpu(1)[0]); t, d = cpu(n); many.append(t)
o, m = statistics.median(one), statistics.median(many)
print(json.dumps({"tree": os.getcwd(), "variant": variant, "ctx_words": len(text.split()), "prefill_cpu_ms": round(o * 1e3, 1),
                  "decode_cpu_ms_per_token": round((m - o) / (n - 1) * 1e3, 2), "tok_s_cpu": round((n - 1) / (m - o), 1)}))
