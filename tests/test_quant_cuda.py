"""Weight-only variants on CUDA, checked on CPU: int4's shape rule tested on the model's own shapes, and
int8's CUDA form (gpt-fast's) against the dequantized matmul. The kernels themselves run in the
prepared GPU check (`python -m engine.bench gpu`)."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from engine.core.errors import LoadError
from engine.platform import capabilities
from engine.quant import quantize, weight_only
from engine.quant.weight_only import int8_dequant_matmul, shape_rule
from engine.runtime import activations
from engine.serving import variants

CUDA = torch.device("cuda")


def test_the_cuda_int4_rule_takes_llama_8b_and_refuses_smollm2():
    for k, n in [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (1536, 576)]:  # 8B; SmolLM2's down
        assert shape_rule("int4wo", "cuda", k, n) is None, (k, n)
    for k, n in [(576, 960), (576, 3072), (4096, 4), (160, 64)]:  # SmolLM2's 576 inputs; 4 outputs; 160 % 128
        assert "divisible by 128" in shape_rule("int4wo", "cuda", k, n)
    assert shape_rule("int4wo", "cpu", 576, 960) is None  # the CPU kernel has the group rule only
    assert "divisible by 32" in shape_rule("int4wo", "cpu", 48, 96)
    assert shape_rule("int8wo", "cuda", 576, 7) is None


def test_int4_on_a_gpu_is_refused_naming_each_layer_shape_that_breaks_the_rule(tiny):
    on_gpu = replace(tiny, device=CUDA)  # tiny's 64-wide inputs break the 128 rule (its down: 128 -> 64 keeps it)
    with capabilities.forced(cuda_int4_weight_only_kernel=True):
        reason = quantize.precheck(on_gpu, "int4wo")
        with pytest.raises(LoadError) as err:
            variants.build(on_gpu, "int4wo")
    assert reason == str(err.value)
    assert "cannot run on cuda with this model: torch's CUDA int4 kernel needs input sizes divisible by 128" in reason
    assert "qkv 64 -> 128" in reason and "gate_up 64 -> 256" in reason and "down" not in reason
    assert reason.endswith("Try int8wo.")


def test_the_kernel_check_probes_the_models_own_shapes_lm_head_included(tiny, monkeypatch):
    seen = []
    monkeypatch.setattr(activations, "_activations",
                        lambda kernel, dev, cands, shapes, cache_dir: seen.append((dev, shapes)) or cands[0])
    for name, head in (("int8wo", False), ("int8wo+head", True)):
        seen.clear()
        variants.precheck(replace(tiny, device=CUDA), name)
        blocks = {(lin.in_features, lin.out_features) for _, _, lin in quantize.quantizable_linears(tiny.model)}
        want = blocks | ({(64, tiny.model.vocab_size)} if head else set())
        assert seen == [("cuda", tuple(sorted(want)))]
    seen.clear()
    variants.precheck(tiny, "int8wo")  # on CPU: the dtype race's own probe shape
    assert seen == [("cpu", (activations._PROBE,))]


def test_the_probe_checks_every_shape_it_is_given():
    got = activations._activations("int8wo", "cpu", (torch.float32,), ((64, 32), (96, 48)), None)
    assert got == torch.float32
    with pytest.raises(LoadError, match="int4wo kernel cannot run"):  # 40 inputs: not whole groups of 32
        activations._activations("int4wo", "cpu", (torch.float32,), ((64, 32), (40, 32)), None)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_int8_cuda_form_equals_the_dequantized_matmul(dtype, tol):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen) * 0.05
    q, scale = weight_only.cpu_gemm.quantize_int8(w)
    x = torch.randn(3, 64, generator=gen)
    want = x @ (q.float() * scale.float()[:, None]).T
    got = int8_dequant_matmul(x.to(dtype), q, scale.to(dtype)).float()
    assert got.shape == (3, 48)
    assert (got - want).abs().max() <= tol * want.abs().max()
    assert torch.equal(int8_dequant_matmul(x, q, scale.float()), F.linear(x, q.float()) * scale.float())


def test_int8wo_on_cuda_says_it_pays_only_with_the_compiled_step():
    for name in ("int8wo", "int8wo+head", "int4wo+head8"):
        assert "pays only with the Compiled step" in quantize.describe(name, "cuda")
        assert quantize.describe(name, "cpu") == quantize.METHODS[name]
    assert quantize.describe("int4wo", "cuda") == quantize.METHODS["int4wo"]
