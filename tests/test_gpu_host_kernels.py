"""Our AVX2 C++ kernels (engine/kernels/cpu_gemm.py) are never built for a model that is not on CPU:
building them takes seconds to minutes (inside the first reply's TTFT) for kernels that cannot take CUDA
tensors. A copy of the tiny model on the meta device stands in for a GPU model (not CPU is what counts),
and a counter replaces the build."""

import copy

import pytest
import torch

from engine.kernels import choose, cpu_attention, cpu_gemm, cpu_layers, plan
from engine.quant.weight_only import (
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    decode_kernels,
)


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
    assert not cpu_layers.serves(off_cpu)
    assert cpu_layers.layer_weights(off_cpu) is None
    assert "our kernels run on CPU; this model is on meta" in cpu_layers.describe(off_cpu)
    assert plan.candidates(off_cpu) is None and plan.load_or_measure(off_cpu, None) is None
    info = choose.describe(off_cpu)  # engine info's kernels
    assert "ours" not in info["decode"]
    assert choose.choose(off_cpu.blocks[0].qkv, 1, plan.Plan(one_row="ours")) is choose.Kernel.ATEN
    assert cpu_attention.kernel_name(torch.bfloat16, "cuda").startswith(cpu_attention.SDPA)
    assert not cpu_attention.serves(torch.empty(2, 1, 2, 8, 16, device="meta"), 4)
    assert not Int8WeightOnlyLinear._use_gemv(True, "cuda") and not Int4WeightOnlyLinear._use_gemv(True, "cuda")
    assert builds == []


def test_the_same_questions_on_a_cpu_model_do_build_them(tiny, builds):
    """The counter sees a build where one is due: the test above could fail."""
    cpu_layers.describe(tiny.model)
    assert builds


def test_weight_only_layers_off_cpu_report_without_a_build(builds):
    int4 = Int4WeightOnlyLinear.from_linear(torch.nn.Linear(64, 32), compute_dtype=torch.float32, gemv=False)
    assert "they run on CPU only" in decode_kernels(torch.nn.Sequential(int4).to("meta"))
    int8 = Int8WeightOnlyLinear.from_linear(torch.nn.Linear(64, 32), compute_dtype=torch.float32, gemv=False)
    assert "pays only with the Compiled step" in decode_kernels(torch.nn.Sequential(int8).to("meta"))
    assert builds == []
