"""Our Llama-family forward gives the logits transformers gives, with and without a cached prefix."""

import pytest
import torch
from conftest import build_tiny_model_dir

from engine.platform import capabilities
from engine.model.fast_llama import FastLlama, unsupported_reason
from engine.model.hf_model import HFCausalLM
from engine.model.kv_cache import KVCache
from engine.runtime.plan import make_plan
from engine.runtime.runner import Runner


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory, tokenizer):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model_dir(tmp_path_factory.mktemp(request.param), tokenizer, request.param, seed=3)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    fast = FastLlama(hf)
    return Runner(fast, make_plan(fast)), reference  # our forward: the runner's, with the model's plan


def test_prefill_then_decode_matches_transformers(pair):
    fast, ref = pair
    ids = torch.randint(0, fast.vocab_size, (12,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = ref(ids[None]).logits[0]
    cache = fast.new_cache(4)  # too small on purpose: it must grow
    got_prefill = fast.forward(ids[:7], cache, all_logits=True)
    got_steps = [fast.forward(ids[i : i + 1], cache) for i in range(7, 12)]
    assert cache.length == 12
    torch.testing.assert_close(got_prefill, want[:7], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(got_steps), want[7:], atol=1e-4, rtol=1e-4)


def test_several_tokens_after_a_cached_prefix_match(pair):
    """A prefill that starts mid-sequence (KV reuse, speculative verification) needs an offset mask."""
    fast, ref = pair
    ids = torch.randint(0, fast.vocab_size, (16,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = ref(ids[None]).logits[0]
    cache = fast.new_cache(16)
    fast.forward(ids[:9], cache)
    got = fast.forward(ids[9:], cache, all_logits=True)
    torch.testing.assert_close(got, want[9:], atol=1e-4, rtol=1e-4)


def test_crop_rolls_back_exactly(pair):
    fast, _ = pair
    ids = torch.arange(10, 20)
    cache = fast.new_cache(32)
    fast.forward(ids[:6], cache)
    a = fast.forward(ids[6:7], cache)
    fast.forward(ids[7:10], cache)  # tokens that are then rejected
    cache.crop(6)
    b = fast.forward(ids[6:7], cache)
    torch.testing.assert_close(a, b)


def test_generic_path_matches_fast_path(tiny):
    fast = Runner(tiny.model, make_plan(tiny.model))
    from transformers import AutoModelForCausalLM

    module = HFCausalLM(AutoModelForCausalLM.from_pretrained(tiny.weights, dtype=torch.float32).eval())
    generic = Runner(module, make_plan(module))  # the transformers forward, behind the same runner
    assert generic.plan.runner == "transformers"
    ids = torch.arange(100, 110)
    c1, c2 = fast.new_cache(16), generic.new_cache(16)
    torch.testing.assert_close(fast.forward(ids, c1), generic.forward(ids, c2), atol=1e-4, rtol=1e-4)
    c2.crop(5)
    assert c2.length == 5
    copy = c2.copy_prefix(3)
    assert copy.length == 3 and c2.length == 5


def test_kv_cache_copy_prefix_and_bytes():
    c = KVCache(layers=2, kv_heads=2, head_dim=4, capacity=8, dtype=torch.float32, device="cpu")
    c.k[:, :, :, :5] = 1.0
    c.length = 5
    d = c.copy_prefix(3)
    assert d.length == 3 and torch.all(d.k[:, :, :, :3] == 1.0)
    assert c.nbytes() == 2 * 2 * 4 * 4 * 5 * 2  # layers * heads * dim * 4 bytes * positions * (K and V)
    with pytest.raises(ValueError):
        c.crop(6)


def test_unsupported_architectures_are_named():
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    assert "gpt2" in unsupported_reason(gpt2)


@pytest.mark.skipif(not capabilities.detect().packed_bf16_weights,
                    reason="needs oneDNN bf16 (AVX512BW/VL/DQ or AVX-NE-CONVERT), this CPU is "
                    f"{capabilities.detect().isa_level}; tests/test_capabilities.py covers the fallback")
def test_multi_row_projections_use_a_packed_weight_with_identical_results():
    """bf16 CPU Linears get a oneDNN-packed copy for 3+ rows; the result is bitwise F.linear's, and
    a replaced or non-bf16 weight never meets a stale copy."""
    from torch import nn

    from engine.kernels.catalogue import Kernel, packed_weight, run
    from engine.runtime.plan import _linear_plan

    def choose(lin, rows):
        return _linear_plan(lin, "cpu", capabilities.detect(), None, None, False).kernel(rows)

    def project(lin, x):
        return run(choose(lin, x.shape[-2]), lin, x)

    lin = nn.Linear(64, 96, bias=True).to(torch.bfloat16)
    x = torch.randn(1, 5, 64).to(torch.bfloat16)
    packed = packed_weight(lin)
    assert packed is not None and packed_weight(lin) is packed  # made once
    assert choose(lin, 5) is Kernel.ONEDNN_PACKED and torch.equal(project(lin, x), lin(x))
    assert choose(lin, 1) is Kernel.ATEN_NO_ONEDNN  # one row: ATen's own GEMV, oneDNN bypassed for the call only
    torch.testing.assert_close(project(lin, x[:, :1]), lin(x[:, :1]), atol=2e-2, rtol=2e-2)
    assert torch.backends.mkldnn.enabled  # the process-wide flag is back on after the call
    lin.weight = nn.Parameter(torch.randn(96, 64).to(torch.bfloat16), requires_grad=False)
    assert packed_weight(lin) is not packed and torch.equal(project(lin, x), lin(x))


@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 37, 576), (1, 5, 64)])
def test_fp32_norm_is_bit_for_bit_the_transformers_formula(shape):
    """RMSNorm takes torch's fused rms_norm in fp32 only because it gives the very same bits."""
    from engine.model.fast_llama import RMSNorm

    gen = torch.Generator().manual_seed(sum(shape))
    x, w = torch.randn(shape, generator=gen) * 3, torch.randn(shape[-1], generator=gen)
    xf = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.equal(RMSNorm(w, 1e-5)(x), w * xf)
