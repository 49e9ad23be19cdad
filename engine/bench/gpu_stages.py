"""The stages of the prepared GPU check (engine/bench/gpu.py): each takes the run's `Context`, returns
its figures (a dict), and raises `Skip` with the reason where it cannot run here. They run the engine's
own paths: generate(), the worker (Engine), the runner's compiled step, variants.build, roofline.annotate."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from engine.bench import gpu_models as gm
from engine.core import clock

AGREE = 0.05  # Timeline vs CUDA events: each of TTFT, prefill and decode within 5% (the bar)


class Skip(Exception):
    """A stage that cannot run here, and why (recorded as the stage's `skipped`)."""


@dataclass
class Context:
    device: torch.device
    tiny: bool  # --shapes tiny
    cache_dir: object
    prompt_tokens: int
    new_tokens: int
    tokenizer_dir: str | None = None  # --tokenizer: where the bundled tokenizer was saved (a bare GPU image)
    limits: object = None  # MachineLimits of this device
    config: object = None  # the bundled LlamaConfig (its shape, --shapes tiny: the tiny one)
    tokenizer: object = None
    small: object = None  # LoadedModel: the bundled shape in the device's serving dtype
    small32: object = None  # LoadedModel: the bundled shape in fp32 (parity, batching, lookup)
    big: object = None  # LoadedModel: the 8B shape in bf16 (CUDA only)
    requests: dict = field(default_factory=dict)  # the request stages' results, for the roofline

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.cuda else torch.float32


def need(model, what: str):
    if model is None:
        raise Skip(f"no {what}: the models stage did not build it (see its error or skip)")
    return model


# --- facts ---------------------------------------------------------------------------------------
def facts(ctx: Context, seconds: float) -> dict:
    from engine.platform import capabilities
    from engine.measure.machine_limits import load_or_measure, probe_dtypes

    from engine.platform.device import cuda_facts, why_no_gpu

    caps, cuda = capabilities.detect(), cuda_facts()  # the start line's facts and reasons (engine/platform/device.py)
    out = {"torch": torch.__version__, "cuda_version": cuda.torch_cuda, "device": str(ctx.device),
           "cuda_available": cuda.available, "triton": caps.triton, "cpu": caps.summary(), "driver": cuda.driver}
    if not cuda.available:
        out["why_no_cuda"] = why_no_gpu(cuda)
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        out.update(device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                   memory_bytes=props.total_memory)
    dtypes = probe_dtypes("bf16" if ctx.cuda else "fp32", ctx.device)
    ctx.limits = load_or_measure(ctx.cache_dir, ctx.device, dtypes, seconds=seconds)
    out["limits"] = {"device": ctx.limits.key.get("device"), "read_gbps": ctx.limits.read_gbps,
                     "copy_gbps": ctx.limits.copy_gbps, "matmul_tflops": dict(ctx.limits.matmul_tflops),
                     "measured_at": ctx.limits.measured_at}
    return out


# --- models --------------------------------------------------------------------------------------
def models(ctx: Context) -> dict:
    config, ctx.tokenizer = gm.bundled_config(), gm.bundled_tokenizer(ctx.tokenizer_dir, ctx.cache_dir)
    ctx.config = gm.shaped(config, **gm.TINY) if ctx.tiny else config
    hf = gm.random_hf(ctx.config, ctx.dtype, ctx.device)
    ctx.small = gm.assemble(hf, ctx.tokenizer, "bundled-shape", ctx.device, ctx.cache_dir)
    out = {"small": _describe(ctx.small, ctx.config)}
    if ctx.cuda and not ctx.tiny:
        try:  # the bundled shape's figures stay, and its stages run, should the 8B shape fail (memory...)
            out["big"] = build_big(ctx, config)
        except Exception as exc:  # noqa: BLE001 - recorded; the run's verdict counts it as an error
            ctx.big = None
            gm.release(ctx.device)
            out["big"] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    else:
        out["big"] = {"skipped": "no CUDA" if not ctx.cuda else "--shapes tiny"}
    return out


def build_big(ctx: Context, config) -> dict:
    big_cfg = gm.shaped(config, **gm.LLAMA3_8B)
    need_bytes = gm.param_bytes(big_cfg, torch.bfloat16)
    free = gm.device_bytes(ctx.device)["free"]
    if free is not None and free < 2.2 * need_bytes:  # the model, its fused q/k/v and gate/up copies while built
        return {"skipped": f"GPU memory: {free / 1e9:.1f} GB free, the 8B shape needs ~{2.2 * need_bytes / 1e9:.0f} GB "
                           "while it is built"}
    hf = gm.random_hf(big_cfg, torch.bfloat16, ctx.device)
    ctx.big = gm.assemble(hf, ctx.tokenizer, "llama3-8b-shape", ctx.device, ctx.cache_dir)
    del hf
    gm.release(ctx.device)
    return _describe(ctx.big, big_cfg)


def _describe(loaded, config) -> dict:
    return {"name": loaded.name, "dtype": loaded.dtype_name, "fast_path": loaded.fast_path,
            "weight_bytes": loaded.weight_bytes(), "layers": config.num_hidden_layers, "hidden": config.hidden_size,
            "build_s": round(loaded.load_s, 2), "memory": gm.device_bytes(loaded.device), "notes": loaded.notes}


# --- one greedy request: the Timeline against the device's clock ---------------------------------
def prompt_ids(tokenizer, n: int) -> list[int]:
    from engine.bench.spec_prompts import BENCH_PROMPTS

    ids: list[int] = []
    while len(ids) < n:
        for text in BENCH_PROMPTS:
            ids += tokenizer(text + "\n\n")["input_ids"]
    return ids[:n]


def timed_request(loaded, ids: list[int], config, limits=None) -> dict:
    """One request through generate(), stamped by the Timeline and by EventClock around the same
    calls; the roofline annotated as the worker annotates it."""
    from engine.bench import runner_for
    from engine.core.request import Request
    from engine.core.timeline import Timeline, now_ns
    from engine.measure import roofline
    from engine.serving.generate import generate

    events = gm.EventClock(loaded.device)
    clock.sync(loaded.device)
    tl = Timeline()
    events.mark("start")
    tl.received_ns = tl.enqueued_ns = tl.started_ns = now_ns()
    done = None
    for event in generate(runner_for(loaded), loaded.tokenizer, loaded.eos_token_ids,
                          Request(prompt_ids=ids, config=config), tl):
        if event.kind == "status" and event.stage == "prefill" and "prefill" not in events.marks:
            events.mark("prefill")
        elif event.kind == "chunk" and event.token_ids:
            events.mark("first" if "first" not in events.marks else "last")
        elif event.kind == "done":
            done = event
    roofline.annotate(tl, loaded.model, loaded.weight_bytes(), limits, loaded.dtype_name, config)
    pairs = {"ttft_ms": (tl.ttft_ms, events.ms("start", "first")),
             "prefill_ms": (tl.prefill_ms, events.ms("prefill", "first")),
             "decode_ms": (tl.decode_ms, events.ms("first", "last"))}
    agree = {k: _rel(a, b) for k, (a, b) in pairs.items()}
    return {"prompt_tokens": tl.prompt_tokens, "output_tokens": tl.output_tokens, "token_ids": done.token_ids,
            "timeline": {k: _r(a) for k, (a, _) in pairs.items()}, "events": {k: _r(b) for k, (_, b) in pairs.items()},
            "rel_diff": agree, "agree": all(v is not None and v <= AGREE for v in agree.values()),
            "tpot_ms": _r(tl.tpot_ms), "decode_tps": _r(tl.decode_tps), "roofline": _roofline(tl)}


def _roofline(tl) -> dict:
    return {"prefill_tflops": _r(tl.prefill_tflops), "prefill_compute_fraction": _r(tl.prefill_compute_fraction),
            "decode_gbps": _r(tl.decode_gbps), "decode_bandwidth_fraction": _r(tl.decode_bandwidth_fraction),
            "peak_tflops": tl.peak_tflops, "read_gbps": tl.read_gbps, "compute_dtype": tl.compute_dtype}


def _rel(a, b):
    return None if a is None or not b else round(abs(a - b) / b, 4)


def _r(v, nd: int = 4):
    return None if v is None else round(v, nd)


def request(ctx: Context, which: str) -> dict:
    from engine.core.config import GenerationConfig

    loaded = need(getattr(ctx, which), f"{which} model")
    ids = prompt_ids(loaded.tokenizer, ctx.prompt_tokens)
    warm = GenerationConfig(temperature=0.0, max_new_tokens=2, kv_reuse=False)
    timed_request(loaded, ids, warm)  # the first prefill of this length pays one-time kernel choices
    result = timed_request(loaded, ids, GenerationConfig(temperature=0.0, max_new_tokens=ctx.new_tokens,
                                                         kv_reuse=False), ctx.limits)
    ctx.requests[which] = result
    result["token_ids"] = result["token_ids"][:8]  # the head of the reply: enough to recognise it
    return result


# --- eager step against the compiled (graph) step ------------------------------------------------
FUSED_S = 90  # seconds the fused step needs at least (Inductor compiles the step before it is captured)


def compiled(ctx: Context, time_left=lambda: float("inf")) -> dict:
    from engine.bench import Stepper, runner_for
    from engine.core.config import GenerationConfig

    loaded = need(ctx.small, "bundled-shape model")
    runner = runner_for(loaded)
    if runner.plan.compiled_reason:  # refused here (no compiler, bitsandbytes): the reason; a failed build raises below
        raise Skip(runner.plan.compiled_reason)
    prepare_s = runner.prepare("compiled", loaded.tokenizer)
    info = dict(runner.compiled_info() or {})
    graphs = info.pop("graphs", None)
    eager = gm.decode_step_ms(Stepper(runner), ctx.device)
    graph = gm.decode_step_ms(Stepper(runner, "compiled"), ctx.device)  # the runner in the toggle's mode
    ids = prompt_ids(loaded.tokenizer, 64)
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=32, kv_reuse=False)
    plain = timed_request(loaded, ids, cfg)
    fast = timed_request(loaded, ids, cfg.replace(compiled_decode=True))
    same = sum(a == b for a, b in zip(plain["token_ids"], fast["token_ids"]))
    out = {"prepare_s": round(prepare_s, 2), "info": info, "eager_step_ms": eager.median_ms,
           "graph_step_ms": graph.median_ms, "speedup": _r(eager.median_ms / graph.median_ms, 2),
           "generate": {"eager_tpot_ms": plain["tpot_ms"], "compiled_tpot_ms": fast["tpot_ms"],
                        "same_tokens": same, "tokens": len(plain["token_ids"])}}
    if graphs is not None:
        out["graphs"] = graphs
    if ctx.cuda:  # Inductor's fused kernels inside the graph: measured before it may become the default
        from engine.platform import capabilities

        out["fused"] = ({"refused": "Triton does not import here"} if not capabilities.detect().triton
                        else {"skipped": f"time budget: {max(time_left(), 0):.0f} s left, it needs ~{FUSED_S} s"}
                        if time_left() < FUSED_S else gm.fused_step_ms(runner, ctx.device))
        if out["fused"].get("step_ms"):
            out["fused"]["speedup_vs_graph"] = _r(graph.median_ms / out["fused"]["step_ms"], 2)
    return out


# --- fp32 parity: our forward against transformers' ----------------------------------------------
@torch.inference_mode()
def parity(ctx: Context) -> dict:
    need(ctx.config, "config")
    hf = gm.random_hf(ctx.config, torch.float32, ctx.device, seed=1)
    ctx.small32 = gm.assemble(hf, ctx.tokenizer, "bundled-shape-fp32", ctx.device, ctx.cache_dir)
    ids = torch.tensor(prompt_ids(ctx.tokenizer, 256), device=ctx.device)
    want = hf(ids[None]).logits[0].float()
    from engine.bench import runner_for

    runner = runner_for(ctx.small32)
    got = runner.forward(ids, runner.new_cache(len(ids)), all_logits=True)
    diff = float((got - want).abs().max())
    top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    return {"positions": len(ids), "max_logit_diff": round(diff, 6), "logit_scale": round(float(want.abs().max()), 4),
            "top1_agreement": round(top1, 4), "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}


# --- continuous batching: 8 requests at max batch 8, each its solo reply ------------------------
def batch(ctx: Context, requests: int = 8) -> dict:
    from engine.bench import CHAT_PROMPTS
    from engine.bench.spec_prompts import DRAFT_PROMPTS
    from engine.core.config import GenerationConfig

    loaded = need(ctx.small32, "fp32 model (the parity stage builds it)")
    prompts = (list(CHAT_PROMPTS) + list(DRAFT_PROMPTS))[:requests]
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=ctx.new_tokens // 2)
    solo, together = _solo_and_batched(loaded, prompts, cfg, requests)
    equal = [a.token_ids == b.token_ids for a, b in zip(solo, together)]
    out = {"requests": len(prompts), "equal": sum(equal), "all_equal": all(equal),
           "max_batch_seen": _max_batch(together), "solo_decode_tps": _median_tps(solo),
           "batched_decode_tps_each": _median_tps(together)}
    if ctx.cuda:  # the compiled toggle's batches: the static step replayed from CUDA graphs of 8 rows
        solo_g, together_g = _solo_and_batched(loaded, prompts, cfg.replace(compiled_decode=True), requests)
        out["graphs"] = {
            "equal_solo": sum(a.token_ids == b.token_ids for a, b in zip(solo_g, together_g)),
            "equal_eager_solo": sum(a.token_ids == b.token_ids for a, b in zip(solo, solo_g)),
            "max_batch_seen": _max_batch(together_g), "batched_decode_tps_each": _median_tps(together_g)}
    return out


def _solo_and_batched(loaded, prompts, cfg, max_batch: int):
    """Each prompt's done event alone, then all submitted at once, through one worker of `max_batch`."""
    from engine.serving.service import Engine

    engine = Engine(loaded, max_batch=max_batch)
    try:
        solo = [engine.complete([{"role": "user", "content": p}], cfg) for p in prompts]
        handles = [engine.submit([{"role": "user", "content": p}], cfg) for p in prompts]
        return solo, [h.result(timeout=600) for h in handles]
    finally:
        engine.close()


def _max_batch(done) -> int:
    return max(max(d.timeline.batch_size or [1]) for d in done)


def _median_tps(done):
    return _r(statistics.median(d.timeline.decode_tps or 0 for d in done), 2)


# --- prompt lookup on a copy-heavy prompt --------------------------------------------------------
def lookup(ctx: Context, runs: int = 2) -> dict:
    from engine.bench.spec_prompts import LOOKUP_PROMPTS
    from engine.core.config import GenerationConfig
    from engine.serving.generate import build_prompt_ids

    loaded = need(ctx.small32, "fp32 model (the parity stage builds it)")
    ids = build_prompt_ids(loaded.tokenizer, [{"role": "user", "content": LOOKUP_PROMPTS[1]}])
    plain_cfg = GenerationConfig(temperature=0.0, max_new_tokens=ctx.new_tokens, kv_reuse=False)
    spec_cfg = plain_cfg.replace(speculative="prompt_lookup", num_speculative_tokens=8)
    plain, spec = [], []
    for _ in range(runs):  # alternating, medians
        plain.append(timed_request(loaded, ids, plain_cfg))
        spec.append(timed_request(loaded, ids, spec_cfg))
    p_ms = statistics.median(r["timeline"]["decode_ms"] or 0 for r in plain)
    s_ms = statistics.median(r["timeline"]["decode_ms"] or 0 for r in spec)
    return {"weights": "random", "prompt_tokens": len(ids), "output_tokens": plain[0]["output_tokens"],
            "equal": all(s["token_ids"] == plain[0]["token_ids"] for s in spec + plain),
            "plain_decode_ms": _r(p_ms, 2), "lookup_decode_ms": _r(s_ms, 2),
            "speedup": _r(p_ms / s_ms, 3) if s_ms else None}


FIRST_VARIANTS = ("int4wo", "int8wo", "int4wo+head8")  # the targets' variants first, should the budget run out
VARIANT_S = 20  # seconds a variant of the 8B shape needs at least (build and steps)


# --- each weights variant: built or refused, its decode step against the base's ---------------
def variants(ctx: Context, time_left) -> dict:
    """Every variant engine/quant/quantize.py lists, on the 8B shape where it was built (else the
    bundled shape): refused (the reason), or built and its decode step timed against the base's,
    with its weight bytes and the device memory it took. One variant at a time (dropped after)."""
    from engine.core.errors import LoadError
    from engine.serving.work import step_weight_bytes
    from engine.bench import Stepper, runner_for
    from engine.quant.quantize import METHODS
    from engine.serving.variants import build, precheck

    base = ctx.big or need(ctx.small, "bundled-shape model")
    base_step = gm.decode_step_ms(Stepper(runner_for(base)), ctx.device)
    step_bytes = step_weight_bytes(base.model)
    read = ctx.limits.read_gbps if ctx.limits else None
    hbm_ms = step_bytes / (read * 1e9) * 1e3 if read else None
    base_graph = gm.graph_step_ms(runner_for(base), base.tokenizer, ctx.device) if ctx.cuda else {"refused": "no CUDA"}
    best = min(base_step.median_ms, base_graph.get("step_ms") or float("inf"))  # the step a user can get
    out = {"base": base.name, "base_dtype": base.dtype_name, "base_step_ms": best,
           "base_eager_step_ms": base_step.median_ms, "base_graph": base_graph,
           "base_step_weight_bytes": step_bytes, "hbm_ms": _r(hbm_ms), "read_gbps": read,
           "step_over_hbm": _r(best / hbm_ms, 3) if hbm_ms else None, "variants": {}}
    for name in sorted(METHODS, key=lambda n: (n not in FIRST_VARIANTS, FIRST_VARIANTS.index(n)
                                                 if n in FIRST_VARIANTS else 0)):
        if name == base.dtype_name:
            continue
        if time_left() < VARIANT_S:
            out["variants"][name] = {"skipped": f"time budget: {max(time_left(), 0):.0f} s left for variants"}
            continue
        reason = precheck(base, name)
        if reason:
            out["variants"][name] = {"refused": reason}
            continue
        before = gm.device_bytes(ctx.device)["allocated"]
        try:
            built, built_runner = build(base, name)
        except LoadError as exc:
            out["variants"][name] = {"refused": str(exc)}
            continue
        after = gm.device_bytes(ctx.device)["allocated"]
        try:
            step = gm.decode_step_ms(Stepper(built_runner), ctx.device)
            graph = gm.graph_step_ms(built_runner, built.tokenizer, ctx.device) if ctx.cuda else {"refused": "no CUDA"}
            step_ms = min(step.median_ms, graph.get("step_ms") or float("inf"))
            out["variants"][name] = {
                "step_ms": step_ms, "eager_step_ms": step.median_ms, "graph": graph,
                "speedup_vs_base": _r(best / step_ms, 3),
                "weight_bytes": built.weight_bytes(), "step_weight_bytes": step_weight_bytes(built.model),
                "device_allocated_bytes": None if before is None else after - before, "build_s": round(built.load_s, 2),
                "notes": built.notes[-1:]}
        finally:
            del built, built_runner
            gm.release(ctx.device)
    return out


# --- the page's roofline fractions of the requests --------------------------------------------
def roofline(ctx: Context) -> dict:
    if not ctx.requests:
        raise Skip("no request ran (see the request stages)")
    fractions = {}
    for which, r in ctx.requests.items():
        for key in ("prefill_compute_fraction", "decode_bandwidth_fraction"):
            fractions[f"{which}.{key}"] = r["roofline"][key]
    known = [v for v in fractions.values() if v is not None]
    return {"fractions": fractions, "known": len(known), "all_at_most_1": all(v <= 1 for v in known) if known else None}
