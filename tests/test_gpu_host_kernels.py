"""Our AVX2 C++ kernels (engine/kernels/cpu_gemm.py) are never built for a model that is not on CPU:
building them takes seconds to minutes (inside the first reply's TTFT) for kernels that cannot take CUDA
tensors. A copy of the tiny model on the meta device stands in for a GPU model (not CPU is what counts),
and a counter replaces the build."""

import copy

import pytest
import torch

from engine.kernels import cpu_attention, cpu_gemm, cpu_layers
from engine.kernels.catalogue import Kernel
from engine.quant.weight_only import Int4WeightOnlyLinear, Int8WeightOnlyLinear
from engine.runtime import plan
from engine.runtime.plan import ALL, ROLES, LinearPlan, make_plan
from engine.runtime.runner import Runner


@pytest.fixture
def builds(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_gemm, "_build", lambda: calls.append(1) or "counted, not built")
    return calls


@pytest.fixture
def off_cpu(tiny):
    model = copy.deepcopy(tiny.model).to("meta")
    assert model.device.type == "meta"
    return model


def test_nothing_a_gpu_model_asks_builds_our_kernels(off_cpu, builds):
    assert cpu_layers.layer_weights(off_cpu, None) is None
    for device in ("meta", "cuda"):  # the plan of a model on the meta device, and one made for a GPU
        p = make_plan(off_cpu, device=device)
        assert p.layer_loop == "python" and f"our kernels run on CPU; this plan is for {device}" in p.layer_loop_text
        assert p.one_row is None and "ours" not in p.describe()["decode"]
        assert all(p.linears[r].kernel(n) is Kernel.ATEN for r in ROLES for n in (1, 64))
        assert p.attention == "sdpa" and p.attention_text.startswith(cpu_attention.SDPA)
        Runner(off_cpu, p)  # its weight copies: none for ATen
    assert not Int8WeightOnlyLinear._ours_builds(True, "cuda") and not Int4WeightOnlyLinear._ours_builds(True, "cuda")
    assert builds == []


def test_the_same_questions_on_a_cpu_model_do_build_them(tiny, builds):
    """The counter sees a build where one is due: the test above could fail."""
    make_plan(tiny.model)
    assert builds


def test_weight_only_layers_off_cpu_report_without_a_build(builds):
    torch_kernels = {role: LinearPlan(((ALL, Kernel.WO_TORCH),)) for role in ROLES}
    int4 = Int4WeightOnlyLinear.from_linear(torch.nn.Linear(64, 32), compute_dtype=torch.float32, ours_layout=False)
    assert "they run on CPU only" in plan._weight_only_text([int4.to("meta")], torch_kernels, None, "meta", None)
    int8 = Int8WeightOnlyLinear.from_linear(torch.nn.Linear(64, 32), compute_dtype=torch.float32, ours_layout=False)
    assert "pays only with the Compiled step" in plan._weight_only_text([int8.to("meta")], torch_kernels, None, "cuda", None)
    assert builds == []
