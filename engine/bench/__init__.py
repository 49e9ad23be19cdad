"""`python -m engine.bench SCENARIO [--json]`: figures printed by the tool itself.

Each scenario is a module in this package with `add_args(parser)` (optional) and
`run(args, out) -> dict`. Human-readable lines go through `out(...)` as the scenario runs;
with --json the last line printed is one JSON object holding the raw figures and a `ratio`.
A scenario that judges its own run sets `"ok"`; `"ok": false` exits 1 (engine/core/errors.py: exit codes).
Runs alternate between the variants compared, in one process, and report medians: these
machines are shared and noisy, so a lone absolute time means little.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys

SCENARIOS = {
    "baseline": "our decode loop vs transformers generate (decode tok/s, identical tokens)",
    "gemv": "our weight-only kernels vs torch's on the model's layer shapes, per row count",
    "bandwidth": "each weight variant's decode step against the machine's read bandwidth (the limits probe's)",
    "dtypes": "prefill and decode speed and quality per dtype (why auto picks what it picks)",
    "kv": "KV reuse: last-turn TTFT of a 6-turn, ~1,500-token chat with the prefix cache vs without; "
          "--kv-dtypes fp16,bf16,int8: KV cache precision, agreement with the model-dtype cache and decode short vs long",
    "quant": "quantization variants: weight bytes, build time, memory, speed, quality vs unquantized",
    "quant_steps": "one decode step per quantization variant, alternating: decode ratios over the loaded model",
    "lookup": "prompt-lookup speculation on copy-heavy prompts: decode tok/s with vs without, acceptance",
    "draft": "draft-model speculation on ordinary chat prompts: decode tok/s with vs without, acceptance",
    "batch_ceiling": "how far continuous batching can go on a mix: decode and prompt forward costs alone, the ratio they allow",
    "verify": "a forward over T tokens in one-token steps, packed oneDNN weights vs plain (speculation's verify cost)",
    "prefill_chunks": "what chunked prefill costs on a long prompt, per chunk size (why the default chunk)",
    "peer": "ours vs llama.cpp (llama-cpp-python in its own venv) on the same GGUF and token ids: decode, TTFT",
    "gpu": "the prepared GPU check: facts, random-weight models (bundled and 8B shapes), Timeline vs CUDA "
           "events, parity, batching, lookup, variants, the compiled step, roofline; one JSON line and a verdict",
    "limits": "the machine's limits (read and copy bandwidth, matmul peaks): cached per machine, or probed now",
    "whatif": "the what-if's TTFT prediction for a longer prompt against the measured TTFT, alternating rounds",
    "report": "the fixed suite in one command (limits, decode per variant, KV reuse, lookup, batching, peer, GPU): "
              "a dated report folder (also `latency-lab report`)",
}

CHAT_PROMPTS = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between Python lists and tuples?",
    "Describe the water cycle for a ten-year-old.",
    "Give me five tips for writing a clear email to a busy manager.",
]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def build_parser(argv: list[str] | None = None, scenarios: dict | None = None, package: str = __name__):
    """The parser for the scenario that argv names (the load flags plus the scenario's own), and
    the scenario's module. `scenarios`/`package`: another set of scenarios run the same way
    (server/bench: the ones that need the HTTP server, which engine/ does not import)."""
    from engine.cli import add_load_args

    scenarios = scenarios or SCENARIOS
    prog = f"python -m {package}"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0].replace("engine.bench", package))
    p.add_argument("scenario", choices=sorted(scenarios), help="; ".join(f"{k}: {v}" for k, v in scenarios.items()))
    p.add_argument("--json", action="store_true", help="end with one JSON line of raw figures")
    add_load_args(p)
    known, _ = p.parse_known_args(argv)
    module = importlib.import_module(f".{known.scenario}", package)
    if hasattr(module, "add_args"):
        module.add_args(p)
    return p, module


def main(argv: list[str] | None = None, scenarios: dict | None = None, package: str = __name__) -> int:
    p, module = build_parser(argv, scenarios, package)
    args = p.parse_args(argv)

    def out(*parts):
        print(*parts, flush=True)

    from engine.core.errors import EXIT_FAILURE, EXIT_OK, LatencyLabError, exit_code

    from engine.core import clock

    t0 = clock.now_ns()
    try:
        result = module.run(args, out)
    except LatencyLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_code(exc)
    result.setdefault("scenario", args.scenario)
    result["bench_s"] = round((clock.now_ns() - t0) / 1e9, 1)
    if args.json:
        print(json.dumps(result))
    else:
        out(f"ratio: {result.get('ratio')}")
        if "ok" in result:
            out(f"ok: {result['ok']}")
    if result.get("ok") is False:
        print(f"{args.scenario}: the run failed its own checks (\"ok\": false)", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def load_model(args, **overrides):
    """Load the model the flags name, and its draft (no progress bar in the figures' output)."""
    from engine.cli import load_config_from_args
    from engine.model.loader import load
    from engine.speculative.draft import load_draft

    cfg = load_config_from_args(args, progress=False)
    if overrides:
        from dataclasses import replace

        cfg = replace(cfg, **overrides)
    loaded = load(cfg)
    loaded.draft = load_draft(cfg.draft_model, loaded)
    return loaded


def runner_for(loaded):
    """The runner of a loaded model (or variant) a bench or a test measures: made once per LoadedModel
    and model object, with its plan (engine/runtime/runner.py open_runner), as the engine's VariantSet
    makes one per variant. Kept on the LoadedModel (its holder; never on the model), so it goes with it."""
    from engine.runtime.runner import open_runner

    held = loaded.__dict__.get("_bench_runner")
    if held is None or held.model is not loaded.model:
        held = loaded.__dict__["_bench_runner"] = open_runner(loaded)
    return held


class Stepper:
    """A runner's one-sequence steps in one mode ('eager' or 'compiled'): what step_times and the
    verify bench call (`new_cache`, `forward`), with the `model` it runs."""

    def __init__(self, runner, mode: str = "eager", kv: str = "model"):
        self.runner, self.model, self.mode, self.kv = runner, runner.model, mode, kv  # kv: the cache's precision

    def new_cache(self, capacity: int):
        return self.runner.new_cache(capacity, self.kv)

    def forward(self, ids, cache, all_logits: bool = False):
        return self.runner.forward(ids, cache, all_logits, self.mode)


def run_request(loaded, messages, config, prefix_cache=None, runner=None, on_event=None, **request_kw):
    """Run one request through the decode loop on this thread (through `runner`, default the loaded
    model's: runner_for); return the done event. `on_event`: called with each event as it comes."""
    from engine.core.request import Request
    from engine.core.timeline import Timeline
    from engine.serving.generate import generate

    tl = Timeline()
    tl.started_ns = tl.enqueued_ns = tl.received_ns
    done = None
    for event in generate(runner or runner_for(loaded), loaded.tokenizer, loaded.eos_token_ids,
                          Request(messages=messages, config=config, **request_kw), tl, prefix_cache=prefix_cache,
                          draft=getattr(loaded, "draft", None)):
        if on_event is not None:
            on_event(event)
        if event.kind == "done":
            done = event
    return done


if __name__ == "__main__":
    sys.exit(main())
