"""Memory read bandwidth of this machine vs the bandwidth each weight variant's decode step achieves.

A decode step reads every weight it uses once, so bytes read per step ÷ step time is the bandwidth
it achieves: the roofline's memory side. Bytes read per step: the variant's weights, less the
embedding when lm_head has its own copy (a step then reads one row of it), plus the KV cache at the
measured context; step times lie between two done-stamps of the one clock (engine/core/clock.py:
the GPU's work, not its launches). The machine's figure is the read bandwidth of the device the model
is on (a GPU's HBM for a model on CUDA, never the host's), from the one limits probe
(engine/measure/machine_limits.py: cached per machine and device with its date, the figure the page and the
API's `timings` divide by; `--remeasure` probes again first), so `fraction_of_read` here and a
reply's `decode_bandwidth_fraction` are the same division. Variants take turns
(quant_steps.step_times), so the ratios between them are measured side by side; one that cannot run
here is listed with the reason. Each variant's GB/s is also set against the loaded model's round by
round (quant_steps.paired_ratio: the rounds' order-adjusted geometric mean and its 95% interval), the figure to
read when the question is whether a variant streams its bytes as fast as the default does.
`--kv-dtypes int8` adds each variant's step over a KV cache of that precision (the kv_cache_dtype
toggle; its bytes counted at that precision, scales included).
A step above the read bandwidth means the cached probe is stale (taken while the machine was busy): the
bench re-probes at once (machine_limits.remeasure_if_exceeded), says so, and prints no fraction above 100%.
"""

from __future__ import annotations

import torch

from engine.cli import comma_list
from engine.bench import median
from engine.bench.quant_steps import paired_ratio, step_times

DEFAULT_VARIANTS = ("int8wo", "int8wo+head", "int4wo", "int4wo+head", "int4wo+head8")


def add_args(p):
    p.add_argument("--remeasure", action="store_true",
                   help="probe the machine's limits again (and cache them) instead of reading the cached probe")
    p.add_argument("--context", type=int, default=256, help="tokens already in the cache at each step")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="decode steps per variant per round")
    p.add_argument("--compiled", action="store_true",
                   help="also measure each variant's compiled decode step (the compiled_decode toggle)")
    p.add_argument("--torch-kernels", action="store_true",
                   help="also measure each weight-only variant's eager step with torch's kernels instead of "
                        "ours (engine/kernels/cpu_gemm.py), side by side")
    p.add_argument("--kv-dtypes", default="", type=comma_list(),
                   help="also measure each variant's step over a KV cache of these precisions (e.g. int8,fp16)")
    p.add_argument("--python-loop", action="store_true",
                   help="also measure the loaded model's step with its layer loop in Python instead of one C++ call "
                        "(engine/kernels/cpu_layers.py), side by side")


def machine_limits_for(args, device, dtype_name: str):
    """The one limits probe of the device the model is on (a GPU's HBM, not the host's memory, for a
    model on CUDA): the cached one, or measured now (and cached)."""
    from engine.cli import load_config_from_args
    from engine.core.errors import LatencyLabError
    from engine.measure.machine_limits import load_or_measure, probe_dtypes
    from engine.model.loader import cache_root

    limits = load_or_measure(cache_root(load_config_from_args(args, progress=False)), device,
                             probe_dtypes(dtype_name, device), force=args.remeasure)
    if limits.key.get("device") != torch.device(device).type:  # the cache is keyed by device: a broken key shows here
        raise LatencyLabError(f"the machine limits at hand are the {limits.key.get('device')}'s, not the {device}'s "
                              "the model is on: re-measure (--remeasure)")
    return limits


def limits_device(limits) -> str:
    """Which device's limits these are: 'cpu', or 'cuda (NVIDIA H200)'."""
    name = limits.key.get("cuda_device")
    return f"{limits.key.get('device')} ({name})" if name else str(limits.key.get("device"))


def bytes_read_per_step(model, context: int, kv: str = "model") -> int:
    """Weight bytes a decode step reads (work.step_weight_bytes), plus the KV at `context` in a cache of
    precision `kv` (the kv_cache_dtype toggle; int8's scales included)."""
    from engine.serving.work import ModelShape, step_weight_bytes

    return step_weight_bytes(model) + ModelShape.of(model).kv_bytes_per_token(model.dtype, kv) * context


def run(args, out):
    from engine.bench import Stepper, load_model
    from engine.core.errors import LatencyLabError
    from engine.kernels import cpu_gemm, switches
    from engine.platform import capabilities
    from engine.cli import load_config_from_args
    from engine.measure.machine_limits import (cache_resident, fraction_text, over_limit, probe_dtypes,
                                               remeasure_if_exceeded)
    from engine.model.loader import cache_root
    from engine.runtime.plan import make_plan
    from engine.runtime.runner import Runner
    from engine.serving.variants import VariantSet

    lm = load_model(args)
    threads = torch.get_num_threads()
    variants = VariantSet(lm, budget_bytes=10**13, quality_texts=0)  # hold them all: this measures
    plan = variants.default.runner.plan
    models, refused = {lm.dtype_name: Stepper(variants.default.runner)}, {}
    for name in args.variants or DEFAULT_VARIANTS:
        try:
            models[name] = Stepper(variants.get(name).runner)
        except LatencyLabError as exc:
            refused[name] = str(exc)
    compiled = {}
    for name in list(models) if args.compiled else ():
        runner = models[name].runner
        try:
            runner.prepare("compiled", lm.tokenizer)
        except LatencyLabError as exc:
            refused[f"{name} compiled"] = str(exc)
            continue
        compiled[f"{name} compiled"] = runner.compiled_info()
        models[f"{name} compiled"] = Stepper(runner, "compiled")  # one-token steps through the graph
    for name in list(models) if args.torch_kernels else ():
        runner = models[name].runner
        wo = runner.plan.decision("weight-only kernels")
        if models[name].mode == "eager" and wo is not None and wo.choice == "ours":  # the same weights, torch's kernels
            models[f"{name} torch"] = Stepper(Runner(runner.model, make_plan(runner.model, weight_only="torch")))
    if args.python_loop:
        with switches.forced_off("layers"):  # a plan made with the switch off: its layers in Python
            models[f"{lm.dtype_name} python loop"] = Stepper(Runner(lm.model, make_plan(lm.model, cache_dir=lm.cache_dir)))
    for kv in [k for k in args.kv_dtypes if k != "model"]:
        for name in [n for n in models if models[n].mode == "eager" and models[n].kv == "model"]:
            models[f"{name} kv {kv}"] = Stepper(models[name].runner, kv=kv)
    limits = machine_limits_for(args, lm.device, lm.dtype_name)
    times = step_times(models, args.context, args.rounds, args.steps, lm.device)
    streamed = {n: (bytes_read_per_step(m.model, args.context, m.kv) / median(times[n]) / 1e9,
                    bytes_read_per_step(m.model, args.context, m.kv)) for n, m in models.items()}
    fastest = max((v for v in streamed.values() if not cache_resident(v[1])), default=(None, None))  # from memory
    limits, note = remeasure_if_exceeded(cache_root(load_config_from_args(args, progress=False)), limits, lm.device,
                                         probe_dtypes(lm.dtype_name, lm.device), gbps=fastest[0],
                                         step_bytes=fastest[1])
    out(f"{capabilities.detect().summary()}; {threads} threads; context {args.context} tokens")
    out(f"weight-only kernels: {cpu_gemm.kernel_name('int4wo')}")
    out(f"layer loop: {plan.layer_loop_text}")
    out(f"machine limits of the {limits_device(limits)} (the page's and the API's): {limits.summary()}")
    d = plan.decision("fp32 one-row")  # which fp32 one-row kernel the steps use (engine/runtime/plan.py)
    one_row = {"path": d.choice, "source": d.source, **(d.measured or {})} if d else None
    if note:  # a step streamed faster than the cached probe said the machine reads: it was re-probed
        out(note)
    for p in plan.notes():
        out(p)
    rows = {}
    for name, m in models.items():
        step = median(times[name])
        read = streamed[name][1]
        gbps = read / step / 1e9
        fraction = limits.decode_fraction(gbps)
        stale = over_limit(fraction) and not cache_resident(read)  # the limit is wrong: no share of it
        rows[name] = {"step_ms": round(step * 1e3, 2), "tok_s": round(1 / step, 1), "mb_per_step": round(read / 1e6, 1),
                      "gbps": round(gbps, 2), "fraction_of_read": None if stale else round(fraction, 3),
                      "limit_stale": stale, "from_cache": cache_resident(read), "kv_cache_dtype": m.kv}
        share = fraction_text(fraction, read) + ("" if over_limit(fraction) else " of the read bandwidth")
        out(f"{name:>13}: {rows[name]['step_ms']:6.1f} ms/step = {1 / step:5.1f} tok/s; reads {read / 1e6:6.1f} MB "
            f"= {gbps:5.1f} GB/s, {share}")
    for name, info in compiled.items():
        out(f"{name}: compiled in {info['compile_s']} s; top-1 agreement with the eager step "
            f"{info['top1_agreement']:.0%} over {info['positions']} positions")
    for name, why in refused.items():
        out(f"{name:>13}: not measured: {why}")
    for name in models:  # GB/s against the default's, paired round by round
        if name == lm.dtype_name:
            continue
        ratio = paired_ratio(times[name], times[lm.dtype_name], args.rounds, args.steps,
                             streamed[name][1] / streamed[lm.dtype_name][1])
        rows[name]["gbps_vs_default"] = ratio
        ci = ratio["ci95"]
        spread = f"95% interval {ci[0]:.2f}-{ci[1]:.2f}" if ci else "interval unknown under 3 rounds"
        out(f"{name:>13}: streams {ratio['ratio']:.2f}x the {lm.dtype_name} step's GB/s (over {args.rounds} "
            f"paired rounds, {spread})")
    default = rows[lm.dtype_name]
    return {"read_gbps": limits.read_gbps, "copy_gbps": limits.copy_gbps, "limits_date": limits.date,
            "limits_note": note,
            "limits_device": limits_device(limits), "device": str(lm.device),
            "limits": limits.to_dict(), "threads": threads, "context": args.context, "dtype": lm.dtype_name,
            "variants": rows, "refused": refused, "compiled": compiled, "ratio": default["fraction_of_read"],
            "capabilities": capabilities.detect().summary(), "one_row_path": one_row,
            "gemv_kernels": cpu_gemm.unavailable_reason() or "ours", "layer_loop": plan.layer_loop_text}
