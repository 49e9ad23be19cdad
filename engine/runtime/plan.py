"""THE execution plan: `make_plan(model, device, caps, cache_dir) -> Plan`, the one place a kernel is chosen.

Made once per (model variant, device) when the variant is loaded or built, a frozen value the runner
(engine/runtime/runner.py) reads per forward as a table lookup. It names, from the declared table
below and the detected capabilities (engine/platform/capabilities.py):
- each projection role's kernel per row bucket (`LinearPlan`: 'qkv', 'o', 'gate_up', 'down', 'lm_head';
  rows are ONE sequence's rows, so a sequence gets the same kernels, and bits, alone and batched);
- the decode-row attention kernel, per KV cache precision (the kv_cache_dtype toggle: the model's dtype,
  or fp16/bf16/int8 read by our kernel widened on the fly, else SDPA over the cache dequantized), the layer
  loop (one C++ call, at every cache precision: `Plan.loop_kv`; or Python), and which step modes can serve
  (eager, the GPU's static step, the compiled step: Inductor on CPU, CUDA graphs on a GPU; both over
  model-dtype caches only).

The table (kernels: engine/kernels/catalogue.py), by the projection's kind:
- w8a (int8 activations, engine/quant/w8a.py): our integer kernels (`WO_INT8ACT`) for every row count
  in the forms of EVERY_ROW_FORMS (a long prompt too: faster than the fp32 GEMM over the dequantized
  weights at every row count measured); in the AVX2 form and under the torch reference, for up to
  OURS_ROWS rows, past them that fp32 GEMM (`WO_DEQUANT_FP32`). The integer kernels' form
  (`w8a_form`) by rule, the best of cpu_qdot.ISAS the capabilities allow (AMX-INT8 tiles for each 16
  rows, AVX-512 VNNI 512-bit, its 256-bit form, AVX-VNNI, AVX2), else the torch reference (no AVX2, no compiler, a switch off);
  which weight kinds' row kernels leave the weights' stream to the hardware's prefetchers rather than ask for
  them 4 KB ahead (`w8a_hardware_stream`) by rule, from the CPU's vendor and family
  (cpu_qdot.HARDWARE_STREAM_CPUS); the runner tells the layers both;
- weight-only int8/4-bit: ours (`WO_OURS`) on CPU where the layer holds our layout and the race below
  picked ours, else torch's (`WO_TORCH`); bitsandbytes: `BNB`; any other module, or off the CPU: `ATEN`;
- fp32 CPU Linear: `OURS_FP32` for up to OURS_ROWS rows where the fp32 one-row decision is 'ours' (by
  rule where our kernel builds); else `ONEDNN_PACKED` for 2..PACKED_FP32_MAX rows (1 row too where the
  one-row decision is 'packed'), where oneDNN packs fp32; else `ATEN` (MKL);
- bf16wo (engine/quant/bf16_weights.py: bf16 weights, fp32 activations): `OURS_BF16W` for up to OURS_ROWS rows
  where our kernel builds (by rule: the fp32 kernel's own code and order over half the bytes), past them and
  elsewhere its own forward (`ATEN`: the weights widened, then MKL);
- bf16 CPU Linear: for 1-2 rows `OURS_BF16` where our kernel builds (by rule: the panels of its bf16 weights
  stream at fp32's speed a byte, where ATen's GEMV and oneDNN read them far slower: `python -m engine.bench
  dtypes`), else `ATEN_NO_ONEDNN` (oneDNN's bf16 GEMM is slow for a row or two); `ONEDNN_PACKED` from 3 rows
  where oneDNN packs bf16, else `ATEN`.
Packed fp32 stops at PACKED_FP32_MAX rows because long prefills were faster through MKL
(`python -m engine.bench verify` and `bandwidth` measure both).

Measured where the order depends on the machine, through the one race (engine/platform/decisions.py
`race`) and kept per machine (`cached`: a restart takes the same kernels, so gives the same bits):
- fp32 one row where our kernel does not build: MKL's GEMV against oneDNN's packed copy, a few decode
  steps through each; the packed copy must win by ONE_ROW_PACKED_IF (it costs memory). Where our
  kernel builds it serves by rule: same bits at any row count, the weights read once for a batch;
- weight-only layers holding both layouts: a decode step through ours and through torch's; torch's
  only where it is KERNELS_MARGIN faster (ours are more precise);
- torch's weight-only kernels' activation dtype (engine/runtime/activations.py, asked before a variant
  is built: the layers are built in it): bf16 only where clearly faster than the model's dtype.
On the meta device nothing is measured: a plan for a declared device and capabilities (tests list a
CUDA plan without a GPU). Tests inject a choice (`one_row=`, `weight_only=`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.core.config import KV_CACHE_DTYPES
from engine.kernels import catalogue, cpu_attention, cpu_gemm, cpu_layers, cpu_qdot
from engine.kernels.catalogue import Kernel
from engine.kernels.cpu_gemm import fp32_rows, plain_cpu
from engine.model.loaded import DTYPE_NAMES
from engine.platform import capabilities, decisions
from engine.quant.weight_only import INT8_CUDA_CAVEAT, Int8WeightOnlyLinear, WeightOnlyLinear
from engine.runtime import eager
from engine.runtime.plan_types import ALL, ONE_ROW_NAMES, ROLES, Decision, LinearPlan, Plan

OURS_ROWS = 256  # our fp32 kernel serves a sequence of up to this many rows: every prompt chunk the scheduler makes
# The w8a forms whose integer kernels beat the fp32 GEMM over the dequantized weights at every row count measured,
# so they take a long prompt's rows too: the vpdpbusd ones. The AVX2 form (vpmaddubsw) lost to it at 1,400 rows
# with int8 weights, so under it a long prompt keeps that GEMM (`python -m engine.bench gemv`: `dequant-fp32`;
# docs/quantization-w8a-2026-12-05.md).
EVERY_ROW_FORMS = ("amx-int8", "avx512-vnni", "avx512-vnni-256", "avx-vnni")
PACKED_FP32_MAX = 128  # fp32 rows from 2 up to this through the packed copy; longer prefills through MKL
ONE_ROW_PACKED_IF = 0.95  # packed step / GEMV step at or below this: single rows go packed too
KERNELS_MARGIN = 1.1  # torch's weight-only kernels only where a step through them is this much faster


def make_plan(model, device=None, caps=None, cache_dir=None, weights: str | None = None,
              one_row: str | None = None, weight_only: str | None = None) -> Plan:
    """The plan for `model` (FastLlama or the transformers module) on `device` (default: where its
    weights are) with capabilities `caps` (default: detected), measured choices kept in `cache_dir`.
    `weights`: the variant's name; `one_row` / `weight_only`: injected choices (tests, benches)."""
    device = torch.device(device) if device is not None else model.device
    caps = caps or capabilities.detect()
    dev, weights = device.type, weights or DTYPE_NAMES_BY.get(model.dtype, str(model.dtype))
    form, hardware, form_decisions = _w8a_form(model, dev, caps)
    if not hasattr(model, "blocks"):  # the generic transformers forward (engine/runtime/hf.py)
        why = "the compiled step needs our Llama-family forward; this model runs the generic transformers one"
        return Plan(dev, weights, "transformers", {}, "transformers", "transformers", 0,
                    {"eager": None, "static": why, "inductor": why, "cuda_graph": why},
                    form_decisions, {"compiled_machine": why}, w8a_form=form, w8a_hardware_stream=hardware)
    roles = {"qkv": [b.qkv for b in model.blocks], "o": [b.o for b in model.blocks],
             "gate_up": [b.gate_up for b in model.blocks], "down": [b.down for b in model.blocks],
             "lm_head": [model.lm_head]}
    mods = [m for ms in roles.values() for m in ms]
    measurable = dev == "cpu" and model.device.type == "cpu"  # nothing is timed on meta, nor for another device
    ours_builds = (dev == "cpu" and any(fp32_rows(m) or plain_cpu(m, torch.bfloat16) for m in mods)
                   and cpu_gemm.available())
    made: list[Decision] = []

    def table(one: str | None, wo: str | None) -> dict[str, LinearPlan]:
        plans = {}
        for role, ms in roles.items():
            kinds = {_linear_plan(m, dev, caps, one, wo, ours_builds, form) for m in ms}
            if len(kinds) != 1:
                raise ValueError(f"the {role} projections are not all of one kind; the plan names one kernel a role")
            plans[role] = kinds.pop()
        return plans

    one = _one_row(model, dev, caps, mods, one_row, ours_builds, measurable, cache_dir, table)
    if one is not None:
        made.append(one)
    wo_layers = [m for m in mods if isinstance(m, WeightOnlyLinear)]
    w8a = [m for m in wo_layers if getattr(m, "int8_activations", False)]
    wo = _weight_only(model, dev, wo_layers, weight_only, measurable, cache_dir, one.choice if one else None, table)
    if wo is not None:
        made.append(wo)
    if len(wo_layers) > len(w8a):
        dtypes = sorted({DTYPE_NAMES_BY[m.compute_dtype] for m in wo_layers if m not in w8a})
        made.append(Decision("weight-only activations", "+".join(dtypes), "told at build (runtime/activations.py)"))
    made += form_decisions
    linears = table(one.choice if one else None, wo.choice if wo else None)
    reasons: dict[str, str] = {}
    attention = _attention(model, dev, reasons)
    kv_attention = _kv_attention(model, dev, reasons)
    reasons["layer_loop"] = _layer_loop_reason(model, dev, linears, form)
    cpp_rows = linears["qkv"].buckets[0][0] if reasons["layer_loop"] is None else 0
    reasons["weight_only"] = _weight_only_text(wo_layers, linears, wo, dev, form)
    modes, reasons["compiled_machine"] = _step_modes(model, dev, caps, mods)
    reasons = {k: v for k, v in reasons.items() if v}
    head_norm = (form is not None and linears["lm_head"].kernel(1) is Kernel.WO_INT8ACT
                 and model.norm.weight.dtype == torch.float32)
    return Plan(dev, weights, "fast", linears, attention, "cpp" if cpp_rows else "python", cpp_rows, modes,
                tuple(made), reasons, kv_attention, w8a_form=form, loop_kv=cpu_layers.KV_KINDS if cpp_rows else (),
                head_norm=head_norm, w8a_hardware_stream=hardware)


def _w8a_form(model, dev, caps) -> tuple[str | None, tuple[int, ...], tuple[Decision, ...]]:
    """The form of our integer kernels the w8a layers (engine/quant/w8a.py) run, by rule: the best of
    cpu_qdot.ISAS whose flags `caps` lists, that cpuid confirms and that passed its check; None (the torch
    reference) where none does, or off the CPU; the weight kinds whose kernels do not prefetch their weights
    (`w8a_hardware_stream`); and the decisions that say so. (None, (), ()) where the model has no w8a layer."""
    if not any(getattr(m, "int8_activations", False) for m in model.modules()):
        return None, (), ()
    form, why = w8a_form(dev, caps)
    made = (Decision("w8a kernel form", form or "torch reference", f"rule ({why})"),)
    if form is None:
        return None, (), made
    hardware, why = w8a_hardware_stream(caps)
    says = "; ".join(f"{cpu_qdot.KIND_NAMES[k]}: {'hardware prefetchers' if k in hardware else 'prefetch 4 KB ahead'}"
                     for k in cpu_qdot.KIND_NAMES)
    return form, hardware, made + (Decision("w8a weight stream", says, f"rule ({why})"),)


def w8a_hardware_stream(caps) -> tuple[tuple[int, ...], str]:
    """The rule for the integer row kernels' weight stream on a CPU with capabilities `caps`: (the weight kinds
    whose kernels leave it to the hardware's prefetchers, why). Every other kernel asks for its weights 4 KB
    ahead (engine/kernels/cpu_stream.h); only on the CPUs of cpu_qdot.HARDWARE_STREAM_CPUS did the hardware's
    prefetchers alone stream some kind faster."""
    for vendor, family, flag, name, kinds in cpu_qdot.HARDWARE_STREAM_CPUS:
        if caps.cpu_vendor == vendor and caps.cpu_family == family and flag in caps.isa:
            return kinds, f"{name}, {vendor} family {family} with {flag}: measured faster so"
    return (), "a software prefetch keeps more of each core's misses in flight"


def w8a_form(dev: str, caps) -> tuple[str | None, str]:
    """The rule the plan applies to a w8a model on device type `dev` with capabilities `caps`: (the form
    of our integer kernels, why), or (None, why the torch reference serves instead). Engine info reads it
    for a w8a variant not built yet (engine/serving/variants.py), so the page knows before the first request."""
    if dev != "cpu":
        return None, f"our integer kernels run on CPU; this plan is for {dev}"
    form = cpu_qdot.best_form(caps)
    if form:
        return form, f"the capabilities list {', '.join(cpu_qdot.ISAS[form][1])}"
    return None, cpu_qdot.unavailable_reason() or "the capabilities allow none of " + ", ".join(cpu_qdot.ISAS)


LOOP_KERNELS = (Kernel.OURS_FP32, Kernel.OURS_BF16W, Kernel.WO_INT8ACT)  # the one-row kernels the C++ loop calls


def _layer_loop_reason(model, dev, linears, form) -> str | None:
    """Why the layers run in Python (None: in one C++ call, for rows up to the first bucket's bound): the
    loop takes every projection as fp32 rows on our panel kernel (fp32 weights, or bf16wo's bf16 ones), or as a w8a
    layer of one kind
    and the plan's form on our integer kernels (cpu_layers.loop_kind)."""
    blocks = [linears[r] for r in ROLES[:4]]
    if dev != "cpu":
        return f"our kernels run on CPU; this plan is for {dev}"
    if model.dtype != torch.float32:  # its norms, rotary tables and attention run fp32 activations only
        return f"the C++ loop runs fp32 activations; this model's are {DTYPE_NAMES_BY.get(model.dtype, model.dtype)}"
    if cpu_layers.loop_kind(model, form) is None:
        return ("a projection is not a plain fp32 Linear, a bf16wo layer nor a w8a layer of one form our kernels "
                "serve (quantized, bf16, GPU)")
    if any(lp.buckets[0][1] not in LOOP_KERNELS or lp != blocks[0] for lp in blocks):
        return f"the kernel decision sends one-row products to {blocks[0].kernel(1).short}, not our kernel"
    return cpu_layers.shape_reason(model) or cpu_layers.unavailable_reason()


DTYPE_NAMES_BY = {v: k for k, v in DTYPE_NAMES.items()}


def _is_bnb(m) -> bool:
    return type(m).__module__.startswith(("bitsandbytes", "engine.quant.bnb"))


def _linear_plan(m, dev, caps, one_row, wo, ours_builds, form: str | None = None) -> LinearPlan:
    """The table (module docstring) for one projection; `form`: the w8a layers' (Plan.w8a_form)."""
    if getattr(m, "int8_activations", False):  # engine/quant/w8a.py: CPU only; its rows get their alone bits
        if dev != "cpu" or form in EVERY_ROW_FORMS:
            return LinearPlan(((ALL, Kernel.WO_INT8ACT),), exact=True)
        return LinearPlan(((OURS_ROWS, Kernel.WO_INT8ACT), (ALL, Kernel.WO_DEQUANT_FP32)), exact=True)
    if getattr(m, "bf16_weights", False):  # engine/quant/bf16_weights.py: fp32 rows over bf16 weights
        if ours_builds and fp32_rows(m):
            return LinearPlan(((OURS_ROWS, Kernel.OURS_BF16W), (ALL, Kernel.ATEN)), exact=True)
        return LinearPlan(((ALL, Kernel.ATEN),), exact=True)
    if isinstance(m, WeightOnlyLinear):
        kernel = Kernel.WO_OURS if dev == "cpu" and m.has_ours and wo == "ours" else Kernel.WO_TORCH
        return LinearPlan(((ALL, kernel),))
    if _is_bnb(m):
        return LinearPlan(((ALL, Kernel.BNB),))
    if type(m) is not nn.Linear or dev != "cpu":
        return LinearPlan(((ALL, Kernel.ATEN),))
    dtype = m.weight.dtype
    if dtype == torch.float32:
        if one_row == "ours" and ours_builds and plain_cpu(m):
            return LinearPlan(((OURS_ROWS, Kernel.OURS_FP32), (ALL, Kernel.ATEN)), exact=True)
        if not caps.packed_fp32_weights:
            return LinearPlan(((ALL, Kernel.ATEN),), exact=True)
        if one_row == "packed":
            return LinearPlan(((PACKED_FP32_MAX, Kernel.ONEDNN_PACKED), (ALL, Kernel.ATEN)), exact=True)
        return LinearPlan(((1, Kernel.ATEN), (PACKED_FP32_MAX, Kernel.ONEDNN_PACKED), (ALL, Kernel.ATEN)), exact=True)
    if dtype == torch.bfloat16:
        if ours_builds and plain_cpu(m, torch.bfloat16):
            first = Kernel.OURS_BF16
        else:
            first = Kernel.ATEN_NO_ONEDNN if torch.backends.mkldnn.is_available() else Kernel.ATEN
        return LinearPlan(((2, first), (ALL, Kernel.ONEDNN_PACKED if caps.packed_bf16_weights else Kernel.ATEN)))
    return LinearPlan(((ALL, Kernel.ATEN),))


def _model_shape(model) -> list:
    cfg = model.config
    return [getattr(cfg, a, None) for a in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "vocab_size")]


def _one_row(model, dev, caps, mods, injected, ours_builds, measurable, cache_dir, table) -> Decision | None:
    """The fp32 one-row decision (None: no plain fp32 projection on CPU)."""
    what = "fp32 one-row"
    if injected is not None:
        if injected not in ONE_ROW_NAMES:
            raise ValueError(f"one_row must be one of {sorted(ONE_ROW_NAMES)}, not {injected!r}")
        return Decision(what, injected, "injected")
    if dev != "cpu" or not any(type(m) is nn.Linear and m.weight.dtype == torch.float32 for m in mods):
        return None
    if ours_builds:
        return Decision(what, "ours", "rule (our kernel builds here)")
    if not caps.packed_fp32_weights or not measurable or catalogue.packed_weight(model.lm_head) is None:
        return Decision(what, "gemv", "rule (no packed fp32 copy to race MKL's GEMV against)" if measurable
                        else "default (nothing is measured for this device)")
    names = ["gemv", "packed"]
    key = {**decisions.machine_key(), "model_shape": _model_shape(model), "candidates": names}
    decision, source = decisions.cached(cache_dir, "kernel-plans", key, lambda: race_one_row(model, table, names),
                                        valid=lambda d: d.get("one_row") in names)
    return Decision(what, decision["one_row"], source, decision.get("measured"))


@torch.inference_mode()
def race_one_row(model, table, names, rounds: int = 5, steps: int = 2) -> dict:
    """A few one-token decode steps through each one-row choice of `names`, alternating (the one race);
    the packed copy only with a ONE_ROW_PACKED_IF lead over GEMV; ours only where it beats the best."""
    plans = {n: _race_plan(model, table(n, "ours")) for n in names}
    prompt = 32
    cache = model.new_cache(prompt + steps + 2)
    eager.forward(model, plans[names[0]], [torch.arange(prompt, device=model.device) % model.vocab_size], [cache])

    def steps_through(name):
        return lambda: [eager.forward(model, plans[name], [[7]], [cache]) for _ in range(steps)]

    r = decisions.race({n: steps_through(n) for n in names}, rounds, model.device, prepare=lambda n: cache.crop(prompt))
    ratio = r.ratio("packed", "gemv")
    best = "packed" if ratio <= ONE_ROW_PACKED_IF else "gemv"
    if "ours" in names and r.ratio("ours", best) < 1.0:
        best = "ours"  # only where a caller races ours too (the plan takes it by rule)
    ms = {f"{p}_ms": round(r.median(p) / steps * 1e3, 2) if p in names else None for p in ("packed", "gemv", "ours")}
    return {"one_row": best, "measured": {"threads": torch.get_num_threads(), **ms, "ratio": round(ratio, 3)}}


def _race_plan(model, linears) -> Plan:
    """A plan that runs `linears` in the Python layer loop: what a race times (eager.forward reads it)."""
    attention = cpu_attention.PLAN_NAME if _attention(model, "cpu", {}) == cpu_attention.PLAN_NAME else "sdpa"
    return Plan("cpu", "race", "fast", linears, attention, "python", 0, {"eager": None})


def _weight_only(model, dev, layers, injected, measurable, cache_dir, one_row, table) -> Decision | None:
    """Ours or torch's kernels for weight-only layers holding both layouts (None: nothing to choose)."""
    what = "weight-only kernels"
    both = [m for m in layers if m.has_ours]
    if not both or dev != "cpu":
        return None
    if injected is not None:
        if injected not in ("ours", "torch"):
            raise ValueError(f"weight_only must be 'ours' or 'torch', not {injected!r}")
        return Decision(what, injected, "injected")
    if not measurable:
        return Decision(what, "ours", "default (nothing is measured for this device)")
    kinds = sorted({f"{type(m).__name__}:{m.in_features}x{m.out_features}:{m.compute_dtype}" for m in both})
    key = {**decisions.machine_key(), "model_shape": _model_shape(model), "weight_only": kinds, "layers": len(both)}
    decision, source = decisions.cached(cache_dir, "weight-only-kernels", key,
                                        lambda: race_weight_only(model, table, one_row),
                                        valid=lambda d: d.get("kernels") in ("ours", "torch"))
    measured = {k: v for k, v in decision.items() if k != "kernels"}
    return Decision(what, decision["kernels"], source, measured)


@torch.inference_mode()
def race_weight_only(model, table, one_row, rounds: int = 3, steps: int = 2) -> dict:
    """A decode step through our weight-only kernels and through torch's, alternating (the one race);
    torch's kept only with a KERNELS_MARGIN lead."""
    plans = {w: _race_plan(model, table(one_row, w)) for w in ("ours", "torch")}
    prompt = 16
    cache = model.new_cache(prompt + steps + 2)
    eager.forward(model, plans["ours"], [torch.arange(prompt, device=model.device) % model.vocab_size], [cache])

    def steps_through(w):
        return lambda: [eager.forward(model, plans[w], [[7]], [cache]) for _ in range(steps)]

    r = decisions.race({w: steps_through(w) for w in plans}, rounds, model.device, prepare=lambda w: cache.crop(prompt))
    torch_over_ours = r.ratio("torch", "ours")
    return {"kernels": "ours" if torch_over_ours * KERNELS_MARGIN >= 1.0 else "torch",
            **{f"{w}_ms": round(r.median(w) / steps * 1e3, 2) for w in ("ours", "torch")}}


def _attention(model, dev, reasons) -> str:
    if dev != "cpu" or model.dtype != torch.float32:
        reasons["attention"] = "our kernel serves fp32 caches on CPU"
        return "sdpa"
    why = cpu_attention.shape_reason(model.n_heads, model.n_kv_heads, model.head_dim) or \
        cpu_attention.unavailable_reason()
    if why:
        reasons["attention"] = why
        return "sdpa"
    return cpu_attention.PLAN_NAME


def _kv_attention(model, dev, reasons) -> dict[str, str]:
    """Per KV precision other than the model's: our kernel reads it (fp32 activations on CPU, where it
    built and passed its check against SDPA), else SDPA over the cache dequantized (the reason kept)."""
    why = None
    if dev != "cpu" or model.dtype != torch.float32:
        why = "our kernel takes fp32 activations on CPU"
    why = why or cpu_attention.shape_reason(model.n_heads, model.n_kv_heads, model.head_dim) or \
        cpu_attention.kv_unavailable_reason()
    if why:
        reasons["kv_attention"] = why
    return {kv: "sdpa" if why else cpu_attention.PLAN_NAME_KV for kv in KV_CACHE_DTYPES if kv != "model"}


def _step_modes(model, dev, caps, mods) -> tuple[dict, str | None]:
    """Which step modes can serve (None) and why not, and why no variant could take the compiled step
    on this machine (None: some could)."""
    machine = None
    if dev == "cpu" and not caps.cpp_compiler:
        machine = "torch.compile needs a C++ compiler on CPU (g++, or $CXX); none was found"
    kinds = sorted({type(m).__name__ for m in mods if _is_bnb(m)})
    weights = None
    if kinds:
        weights = f"the compiled step does not trace {', '.join(kinds)} layers (bitsandbytes); pick int8wo or int4wo"
    elif dev == "cpu" and model.dtype == torch.bfloat16 and any(type(m) is nn.Linear for m in mods):
        weights = ("the compiled step does not trace a bf16 model's plain linears on CPU (their one-row matmuls "
                   "run our bf16 panels, or ATen's with oneDNN switched off, which a graph cannot do); pick a "
                   "variant whose every linear is weight-only (int8wo+head, int4wo+head) or fp32 weights")
    return {"eager": None,
            "static": None if dev == "cuda" else "the static step serves one-token steps on a GPU; on CPU the eager "
                                                 "forward keeps its exact per-sequence attention",
            "inductor": (machine or weights) if dev == "cpu" else "on a GPU the compiled step is CUDA graphs",
            "cuda_graph": (machine or weights) if dev == "cuda" else "CUDA graphs need a CUDA device"}, machine


def _weight_only_text(layers, linears, wo: Decision | None, dev: str, form: str | None) -> str:
    """What the weight-only layers decode with, for engine info ('' where there are none)."""
    if not layers:
        return ""
    w8a = [m for m in layers if getattr(m, "int8_activations", False)]
    if w8a:  # engine/quant/w8a.py: the plan's form
        return ("int8 activations per block of 32: " + (f"our integer kernels, {form}: {cpu_qdot.ISAS[form][2]}"
                                                         if form else cpu_qdot.describe(None))
                + " (engine/kernels/cpu_qdot.py)")
    kernels = {linears[r].kernel(1) for r in ROLES if linears[r].kernel(1) in (Kernel.WO_OURS, Kernel.WO_TORCH)}
    if kernels == {Kernel.WO_OURS}:
        return cpu_gemm.NAME
    if wo is not None and wo.choice == "torch" and all(m.has_ours for m in layers):
        m = wo.measured or {}
        return (f"torch's weight-only kernels: a decode step measured faster through them here "
                f"({m.get('torch_ms')} ms against ours {m.get('ours_ms')} ms; {wo.source})")
    if dev != "cpu" and any(isinstance(m, Int8WeightOnlyLinear) for m in layers):
        return f"int8: F.linear over the weights cast to the activations' dtype (gpt-fast's form); {INT8_CUDA_CAVEAT}"
    why = (cpu_gemm.unavailable_reason() if dev == "cpu" else "they run on CPU only") or "a layer's shape"
    return f"torch's weight-only kernels; ours not used: {why}"
