"""Quantization variants side by side: weight bytes, build time, memory, speed and quality.

Every variant is built from the loaded model (engine/quant/quantize.py) and measured in this process:
  weight_bytes    real storage of its tensors (quantized data, scales and absmax included)
  build_s         building it from the loaded model
  memory          where the two figures below were read: "gpu" (the model's CUDA device:
                  torch.cuda's allocator) or "host" (the process's resident memory, RSS)
  peak_memory_bytes  peak memory of a fresh process that loads the model and builds only this
                  variant (run apart, since a process's peak never goes down; on a GPU the peak is
                  reset after the load, so it is the build's peak with the loaded model resident);
                  build_memory_bytes says what the build added
  prefill_tps     a --prefill-tokens prompt, one forward: prompt tokens / prefill time (between
                  two done-stamps of the one clock, engine/core/clock.py)
  decode_tps      greedy chat replies: (tokens - 1) / (last - first token time), median
  top1_agreement, mean_kl   against the loaded (unquantized) model, engine/quant/quality.py
  perplexity      on the quality set's answers (teacher-forced; the loaded model's own beside it)
  decode_vs_default, prefill_vs_default   those speeds over the loaded (default) variant's
Runs alternate between the variants, and medians are reported. `ratio` = nf4 weight bytes /
bf16 weight bytes. `+head` rows also quantize lm_head (its own copy; the embedding stays):
int8wo+head and int4wo+head are engine variants, `--head-rows` adds bitsandbytes ones.
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from engine.cli import comma_list
from engine.bench import CHAT_PROMPTS, load_model, median, run_request
from engine.bench.dtypes import TEXT
from engine.core import clock


def add_args(p):
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="alternating runs per prompt")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--head-rows", default="nf4", type=comma_list(),
                   help="bitsandbytes methods also measured with lm_head quantized")
    p.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak memory probes")


def run(args, out):
    from engine.core.config import GenerationConfig
    from engine.platform import capabilities
    from engine.quant.quality import compare, next_token_logits, quality_inputs
    from engine.quant.quantize import QUANTIZED
    from engine.runtime.activations import probe_results
    from engine.serving.variants import VariantSet, build

    lm = load_model(args)
    names = args.variants or list(QUANTIZED)
    variants = VariantSet(lm, budget_bytes=10**13)  # hold them all: this measures, it does not serve
    names = [variants.default_name] + [n for n in names if n != variants.default_name]
    if "bf16" not in names and lm.dtype != torch.bfloat16:
        names.insert(1, "bf16")  # the ratio's denominator
    out(f"model {lm.name} {lm.dtype_name} on {lm.device}, {torch.get_num_threads()} threads; variants {names}")
    out(f"machine: {capabilities.detect().summary()}")

    rows, models = {}, {}
    for name in names:
        v = variants.get(name)
        rows[name] = {"method": v.method, "weight_bytes": v.weight_bytes, "build_s": round(v.build_s, 2),
                      "top1_agreement": v.quality["top1_agreement"], "mean_kl": v.quality["mean_kl"],
                      "perplexity": v.quality.get("perplexity")}
        models[name] = (v.loaded, v.runner)
        out(f"  built {name} in {v.build_s:.1f} s: {v.loaded.notes[-1] if v.loaded.notes else ''}")
    ref_ppl = next((v.quality.get("reference_perplexity") for n in names[1:] if (v := variants.get(n)).quality), None)
    rows[names[0]]["perplexity"] = rows[names[0]]["perplexity"] or ref_ppl  # the loaded model's own
    inputs = quality_inputs(lm.tokenizer)
    reference = next_token_logits(variants.default.runner, inputs)
    for name in [h for h in args.head_rows if f"{h}+head" not in rows]:
        t0 = clock.now_ns()
        loaded, runner = build(lm, name, quantize_lm_head=True)
        build_s = (clock.done_ns(lm.device) - t0) / 1e9
        q = compare(reference, next_token_logits(runner, inputs), inputs)
        rows[f"{name}+head"] = {"method": f"{QUANTIZED[name]}; lm_head quantized too (untied)", "adhoc": True,
                                "weight_bytes": loaded.weight_bytes(), "build_s": round(build_s, 2),
                                "top1_agreement": q["top1_agreement"], "mean_kl": q["mean_kl"],
                                "perplexity": q["perplexity"]}
        models[f"{name}+head"] = (loaded, runner)

    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    ids = torch.tensor(lm.tokenizer(TEXT)["input_ids"][: args.prefill_tokens], device=lm.device)
    decode, prefill = {n: [] for n in models}, {n: [] for n in models}
    for r in range(args.runs):
        for prompt in CHAT_PROMPTS[: args.prompts]:
            for name, (loaded, runner) in models.items():  # alternate: each variant sees the same machine state
                done = run_request(loaded, [{"role": "user", "content": prompt}], gen, runner=runner)
                decode[name].append(done.timeline.decode_tps)
        for name, (loaded, runner) in models.items():
            cache = runner.new_cache(len(ids))
            t = clock.done_s(lm.device)
            runner.forward(ids, cache)
            prefill[name].append(len(ids) / (clock.done_s(lm.device) - t))
        out(f"  run {r + 1}/{args.runs}: decode tok/s " + ", ".join(f"{n} {median(decode[n]):.1f}" for n in models))

    bf16_bytes = rows["bf16"]["weight_bytes"] if "bf16" in rows else None
    default = variants.default_name
    for name, row in rows.items():
        row["decode_tps"] = round(median(decode[name]), 1)
        row["prefill_tps"] = round(median(prefill[name]), 1)
        row["bytes_vs_bf16"] = round(row["weight_bytes"] / bf16_bytes, 3) if bf16_bytes else None
        row["decode_vs_default"] = round(median(decode[name]) / median(decode[default]), 2)
        row["prefill_vs_default"] = round(median(prefill[name]) / median(prefill[default]), 2)
        probe = {} if args.no_memory or row.get("adhoc") else _peak_memory(args, name)
        row["memory"] = probe.get("memory")
        row["peak_memory_bytes"], row["build_memory_bytes"] = probe.get("peak_bytes"), probe.get("build_bytes")
        peak = f"{row['peak_memory_bytes'] / 1e6:6.0f}" if row["peak_memory_bytes"] else "     -"
        out(f"{name:>12}: {row['weight_bytes'] / 1e6:6.1f} MB ({row['bytes_vs_bf16']} of bf16)  build "
            f"{row['build_s']:5.2f} s  peak {row['memory'] or 'memory'} {peak} MB  prefill {row['prefill_tps']:6.1f} tok/s  decode "
            f"{row['decode_tps']:5.1f} tok/s ({row['decode_vs_default']:.2f}x {default})  top-1 "
            f"{row['top1_agreement']:.1%}  KL {row['mean_kl']:.4f}  perplexity "
            + (f"{row['perplexity']:.3f}" if row.get("perplexity") else "-"))
    out("weight-only kernels' one-time activation check (min µs of one 576 -> 1536 matmul): "
        + ", ".join(f"{k[0]} {k[2]} {v}" for k, v in probe_results.items()))
    ratio = round(rows["nf4"]["weight_bytes"] / bf16_bytes, 3) if "nf4" in rows and bf16_bytes else None
    return {"variants": rows, "ratio": ratio, "capabilities": capabilities.detect().summary(),
            "weight_only_probe": {" ".join(k): v for k, v in probe_results.items()}, "reference": variants.default_name, "device": str(lm.device),
            "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens, "runs": args.runs,
            "prompts": args.prompts, "prefill_tokens": len(ids), "quality_positions": sum(len(r) for r in reference)}


def _peak_memory(args, name: str) -> dict:
    """`memory_probe`'s figures from a fresh process that loads the model as flagged and builds only
    `name` ({} where it failed)."""
    load = {"model": args.model, "dtype": args.dtype, "device": args.device, "threads": args.threads,
            "fast_path": not args.no_fast_path, "progress": False}
    code = f"from engine.bench.quant import memory_probe; memory_probe({load!r}, {name!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else {}


def memory_probe(load_kwargs: dict, name: str) -> None:
    """Print one JSON line: where memory was read ("gpu" or "host"), the peak while building `name`
    and what the build added."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.serving.variants import VariantSet

    lm = load(LoadConfig(**load_kwargs))
    variants = VariantSet(lm, budget_bytes=10**13, quality_texts=0)
    print(json.dumps(measure_build(lm.device, lambda: variants.get(name))))


class Memory:
    """The memory a variant takes, read where the model is: on CUDA torch.cuda's allocator (its peak
    can be reset), elsewhere the process's resident memory (whose peak, VmHWM, cannot)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.kind = "gpu" if self.device.type == "cuda" else "host"

    def reset_peak(self) -> None:
        if self.kind == "gpu":
            torch.cuda.reset_peak_memory_stats(self.device)

    def current(self) -> int:
        if self.kind == "gpu":
            return torch.cuda.memory_allocated(self.device)
        import psutil

        return psutil.Process().memory_info().rss

    def peak(self) -> int:
        if self.kind == "gpu":
            return torch.cuda.max_memory_allocated(self.device)
        from engine.serving.variants import peak_rss_bytes

        return peak_rss_bytes()


def measure_build(device, build) -> dict:
    """Run `build()` and return {"memory": "gpu" | "host", "peak_bytes", "build_bytes"} on `device`'s memory."""
    meter = Memory(device)
    clock.sync(device)  # what was launched before is not the build's
    meter.reset_peak()
    before = meter.current()
    build()
    clock.sync(device)
    return {"memory": meter.kind, "peak_bytes": meter.peak(), "build_bytes": meter.current() - before}
