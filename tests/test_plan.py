"""The execution plan (engine/runtime/plan.py), listed: for every weights variant on this CPU, and for
a CUDA device built on the meta device (declared capabilities: nothing built, nothing raced). Run with
`-s` to read the lists."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from engine.kernels import cpu_attention, cpu_gemm
from engine.kernels.catalogue import Kernel
from engine.platform import capabilities, decisions
from engine.quant.quantize import FP32_ACTIVATIONS, INT8_ACTIVATIONS, METHODS, WEIGHT_ONLY, split_name
from engine.runtime.plan import EVERY_ROW_FORMS, ROLES, make_plan
from engine.serving.variants import build, precheck

CAPS = capabilities.detect()
A_GPU = replace(CAPS, cuda=True, cuda_device="a declared GPU", cuda_capability=(9, 0), cuda_bf16=True, triton=True,
                cuda_int4_weight_only_kernel=True)


def _show(title: str, plan) -> None:
    d = plan.describe()
    print(f"\n{title}: " + json.dumps({k: d[k] for k in ("device", "weights", "prefill", "decode", "attention",
                                                           "layer_loop", "linears", "step_modes")}))


def _check(plan) -> None:
    """What every plan holds: a kernel table per role that answers any row count, the step modes."""
    assert set(plan.linears) == set(ROLES)
    for lp in plan.linears.values():
        assert [most for most, _ in lp.buckets] == sorted(most for most, _ in lp.buckets)
        assert all(isinstance(lp.kernel(n), Kernel) for n in (1, 2, 3, 64, 300, 5000))
    assert set(plan.step_modes) == {"eager", "static", "inductor", "cuda_graph"} and plan.step_modes["eager"] is None
    assert plan.describe()["decode"] == plan.used(1)


@pytest.fixture(scope="module")
def built(tiny):
    """Every weights variant of the tiny model built here (its plan made as the engine makes it), or why not."""
    out = {}
    for name in METHODS:
        reason = precheck(tiny, name)
        out[name] = reason if reason else build(tiny, name)
    return out


@pytest.mark.parametrize("name", list(METHODS))
def test_every_weights_variant_has_a_plan_on_this_cpu(built, name):
    got = built[name]
    if isinstance(got, str):  # refused up front, with the reason the page shows (bitsandbytes without AVX2)
        assert name in ("int8", "nf4", "fp4") and got
        return
    loaded, runner = got
    plan = runner.plan
    _show(f"{name} on this CPU", plan)
    _check(plan)
    assert plan.device == "cpu" and plan.weights == name and plan.runner == "fast"
    method, head = split_name(name)
    ours = cpu_gemm.available()
    if method == "fp32":
        assert (plan.linears["qkv"].kernel(1) is Kernel.OURS_FP32) == ours
        assert (plan.layer_loop == "cpp") == ours and plan.cpp_rows == (256 if ours else 0)
        assert plan.linears["qkv"].exact and plan.one_row == ("ours" if ours else plan.one_row)
    elif method == "bf16":
        # our panels over its bf16 weights where our kernel builds (by rule), else ATen's GEMV without oneDNN
        assert (plan.linears["qkv"].kernel(1) is Kernel.OURS_BF16) == ours
        assert ours or plan.linears["qkv"].kernel(1) in (Kernel.ATEN_NO_ONEDNN, Kernel.ATEN)
        assert plan.linears["qkv"].kernel(3) is not Kernel.OURS_BF16  # a prompt's rows: oneDNN's packed GEMM
        assert plan.compiled_reason and "bf16" in plan.compiled_reason and plan.layer_loop == "python"
    elif method == "fp16":  # no fast fp16 kernel of ours or oneDNN's on CPU: ATen's matmul
        assert all(plan.linears[r].kernel(n) is Kernel.ATEN for r in ROLES for n in (1, 300))
    elif method in INT8_ACTIVATIONS:  # our integer kernels for every row count where they run in a form; under
        # the torch reference a long prompt's rows take the fp32 GEMM over the dequantized weights
        assert all(plan.linears[r].kernel(1) is Kernel.WO_INT8ACT for r in ROLES[:4])
        assert (plan.layer_loop == "cpp") == (loaded.dtype == torch.float32 and cpu_gemm.available())
        every = plan.w8a_form in EVERY_ROW_FORMS
        long = Kernel.WO_INT8ACT if every else Kernel.WO_DEQUANT_FP32
        assert all(plan.linears[r].kernel(n) is long for r in ROLES[:4] for n in (300, 5000))
        assert plan.describe()["cpp_rows"] == (None if plan.layer_loop == "cpp" and every else plan.cpp_rows)
        assert plan.decision("w8a kernel form") is not None and plan.weight_only_text.startswith("int8 activations")
    elif method in FP32_ACTIVATIONS:  # bf16wo: our panels over its bf16 weights, fp32 rows, in the C++ loop
        one = Kernel.OURS_BF16W if ours else Kernel.ATEN
        assert all(plan.linears[r].kernel(1) is one for r in ROLES[:4]) and plan.layer_loop == ("cpp" if ours else "python")
        assert all(plan.linears[r].kernel(300) is Kernel.ATEN for r in ROLES)  # past 256 rows: widened into MKL
        assert (plan.linears["lm_head"].kernel(1) is one) == (head is not None)
        why = plan.step_modes["inductor"]  # no layer of it the compiled step refuses: a missing compiler at most
        assert why is None or "C++ compiler" in why
    elif method in WEIGHT_ONLY:
        chosen = plan.decision("weight-only kernels")
        want = Kernel.WO_OURS if chosen is not None and chosen.choice == "ours" else Kernel.WO_TORCH
        assert all(plan.linears[r].kernel(n) is want for r in ROLES[:4] for n in (1, 300))
        head_kernel = plan.linears["lm_head"].kernel(1)
        assert (head_kernel in (Kernel.WO_OURS, Kernel.WO_TORCH)) == (head is not None)
        assert plan.decision("weight-only activations") is not None and plan.weight_only_text
    else:  # bitsandbytes
        assert all(plan.linears[r].kernel(1) is Kernel.BNB for r in ROLES[:4])
        assert "bitsandbytes" in plan.compiled_reason
    attention = loaded.dtype == torch.float32 and cpu_attention.unavailable_reason() is None  # fp32 caches on CPU
    assert plan.attention == ("ours-cpu" if attention else "sdpa")


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "int8wo", "int8wo+head", "int4wo", "int4wo+head",
                                  "int4wo+head8"])
def test_a_cuda_plan_from_declared_capabilities_on_the_meta_device(built, tiny, name, monkeypatch):
    """A GPU's plan without a GPU: the variant's module moved to the meta device, the capabilities
    declared. Nothing is measured (no race runs) and none of our CPU kernels is built for it."""
    def no_race(*args, **kwargs):
        raise AssertionError("a plan for the meta device must not time anything")

    monkeypatch.setattr(decisions, "race", no_race)
    built_here = built[name]
    assert not isinstance(built_here, str), built_here
    dtype = torch.bfloat16 if name in ("fp32", "bf16") else None  # what a GPU would load: bf16
    module = copy.deepcopy(built_here[0].model)
    module = (module.to(dtype) if dtype else module).to("meta")
    plan = make_plan(module, "cuda", caps=A_GPU, weights=name)
    _show(f"{name} on a declared CUDA GPU (meta)", plan)
    _check(plan)
    assert plan.device == "cuda" and plan.one_row is None and plan.layer_loop == "python" and plan.cpp_rows == 0
    assert plan.attention == "sdpa" and plan.step_modes["static"] is None and plan.compiled_mode == "cuda_graph"
    assert plan.step_modes["cuda_graph"] is None and plan.step_modes["inductor"]
    kernels = {plan.linears[r].kernel(n) for r in ROLES for n in (1, 64)}
    assert kernels <= {Kernel.ATEN, Kernel.WO_TORCH}  # cuBLAS and torch's weight-only kernels: none of ours
    assert (Kernel.WO_TORCH in kernels) == (split_name(name)[0] in WEIGHT_ONLY)
    assert plan.decision("fp32 one-row") is None and plan.decision("weight-only kernels") is None
