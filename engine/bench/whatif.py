"""`python -m engine.bench whatif`: the what-if (engine/measure/whatif.py) checked against a measurement:
predict a `--factor` x longer prompt's TTFT from a reply, then run it; rounds alternate (base, longer),
each prediction from that round's base reply; prints every round and the medians."""

from __future__ import annotations

import json
import statistics

from engine.measure.whatif import longer_messages, predict
from engine.serving.work import ModelShape


def add_args(p) -> None:
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", default="Explain in detail how a hash table handles collisions, and compare "
                                       "chaining with open addressing.")


def run(args, out) -> dict:
    from engine.cli import load_config_from_args
    from engine.core.config import GenerationConfig
    from engine.lab import open_engine

    engine = open_engine(load_config_from_args(args, progress=False))
    try:
        shape = ModelShape.of(engine.loaded.model)
        cfg = GenerationConfig(temperature=0.0, max_new_tokens=8, kv_reuse=False)
        messages = [{"role": "user", "content": args.prompt}]
        longer, base_n, long_n = longer_messages(engine.tokenizer, messages, args.factor)
        engine.complete(messages, cfg)  # warm-up: first-use costs are not the model's
        rounds = []
        for _ in range(args.rounds):
            a = engine.complete(messages, cfg).timeline.to_dict()
            b = engine.complete(longer, cfg).timeline.to_dict()
            pred = predict(a, shape, prefill_tokens=b["prefill_tokens"])
            rounds.append({"base_ttft_ms": round(a["ttft_ms"], 1), "predicted_ttft_ms": round(pred.ttft_ms, 1),
                           "measured_ttft_ms": round(b["ttft_ms"], 1),
                           "error": round(pred.ttft_ms / b["ttft_ms"] - 1, 3), "how": pred.how})
            out(json.dumps(rounds[-1]))
    finally:
        engine.close()
    med_p = statistics.median(r["predicted_ttft_ms"] for r in rounds)
    med_m = statistics.median(r["measured_ttft_ms"] for r in rounds)
    return {"prompt_tokens": [base_n, long_n], "factor": round(long_n / base_n, 2),
            "median_predicted_ttft_ms": med_p, "median_measured_ttft_ms": med_m,
            "median_error": round(med_p / med_m - 1, 3), "median_of_errors": statistics.median(r["error"] for r in rounds),
            "ratio": round(med_p / med_m, 3), "rounds": rounds}
