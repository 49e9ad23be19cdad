"""The fused pieces of a decoder layer (engine/kernels/cpu_fused.cpp) give the very bits of the torch ops
they replace, which the layers' Python loop runs: rms_norm then the product, silu(gate) * up then the
product, the bias and residual adds after it, and rotary positions on q and k."""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import cpu_gemm, cpu_qdot
from engine.platform import capabilities
from engine.runtime.blocks import roped_heads

pytestmark = pytest.mark.skipif(cpu_gemm.unavailable_reason() is not None, reason="our kernels do not build here")


def _weights(kind, n, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if kind == 1:
        return list(cpu_qdot.quantize_int8(torch.randn(n, k, generator=gen) * 0.05))
    q = torch.randint(0, 16, (n, k), generator=gen)
    return [cpu_qdot.pack_int4(q, torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-3,
                               torch.randn(n, k // 32, generator=gen) * 0.01)]


def _plain(x, weights, kind, isa):
    return (cpu_qdot.int8_w8a(x, *weights, isa) if kind == 1 else cpu_qdot.int4_w8a(x, *weights, isa))


@pytest.mark.parametrize("kind", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 5, 64, 300])
def test_a_normed_projection_is_rms_norm_then_the_product_bit_for_bit(kind, rows):
    isa = cpu_qdot.best_form(capabilities.detect())
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 576, generator=gen) * torch.logspace(-2, 1, 576)
    norm = torch.randn(576, generator=gen)
    w = _weights(kind, 200, 576)
    bias, resid = torch.randn(200, generator=gen), torch.randn(rows, 200, generator=gen)
    normed = F.rms_norm(x, (576,), norm, 1e-5)[0]  # what the Python loop's RMSNorm gives
    want = resid + (_plain(normed, w, kind, isa) + bias)
    got = torch.ops.latency_lab_gemv.qdot_project(x[0], norm, 1e-5, None, w, kind, cpu_qdot.ISAS[isa][0], bias, resid)
    assert torch.equal(got, want)


@pytest.mark.parametrize("hidden", [960, 2080, 4128])
def test_a_normed_projection_sums_its_squares_in_torchs_order_at_every_width(hidden):
    # The norm sums x * x in at::sum's own order (cpu_qdot_quant.cpp torch_row_sum), which here must be
    # the fast way, not at::sum itself; widths that reach its cascade and its scalar tail.
    assert torch.ops.latency_lab_gemv.qdot_sum_lanes() in (8, 16)
    isa = cpu_qdot.best_form(capabilities.detect())
    gen = torch.Generator().manual_seed(hidden)
    x = torch.randn(3, hidden, generator=gen) * torch.logspace(-3, 2, hidden)
    norm = torch.randn(hidden, generator=gen)
    w = _weights(2, 64, hidden)
    want = _plain(F.rms_norm(x, (hidden,), norm, 1e-6), w, 2, isa)
    got = torch.ops.latency_lab_gemv.qdot_project(x, norm, 1e-6, None, w, 2, cpu_qdot.ISAS[isa][0], None, None)
    assert torch.equal(got, want)


def test_a_normed_projection_refuses_inputs_not_in_whole_blocks():
    isa = cpu_qdot.best_form(capabilities.detect())
    w = _weights(2, 64, 576)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.latency_lab_gemv.qdot_project(torch.randn(2, 100), torch.ones(100), 1e-6, None, w, 2,
                                                cpu_qdot.ISAS[isa][0], None, None)


def test_silu_is_made_on_the_way_here():
    # The gated projections compute torch's silu in the quantizer (cpu_qdot_quant.cpp silu8) where a probe
    # finds at::silu's bits; this torch must be such a one, or the down projection pays at::silu's call again.
    # The bits themselves: the gated tests below, against F.silu.
    assert torch.ops.latency_lab_gemv.qdot_silu_matches()


@pytest.mark.parametrize("kind", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_a_gated_projection_is_silu_times_up_then_the_product_bit_for_bit(kind, rows):
    isa = cpu_qdot.best_form(capabilities.detect())
    gen = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(1, rows, 2 * 1536, generator=gen) * 3
    gate_up[..., :8] = torch.tensor([0.0, -0.0, 90.0, -90.0, 105.0, -105.0, 1e-39, -1e30])  # silu's tails and cut-offs
    gate, up = gate_up.chunk(2, dim=-1)
    w = _weights(kind, 576, 1536, seed=1)
    resid = torch.randn(rows, 576, generator=gen)
    want = resid + _plain((F.silu(gate) * up)[0].contiguous(), w, kind, isa)
    got = torch.ops.latency_lab_gemv.qdot_project(gate[0], None, 0.0, up[0], w, kind, cpu_qdot.ISAS[isa][0], None,
                                                  resid)
    assert torch.equal(got, want)
    plain = torch.ops.latency_lab_gemv.qdot_project(gate_up[0, :, :1536].contiguous(), None, 0.0, None, w, kind,
                                                    cpu_qdot.ISAS[isa][0], None, None)
    assert torch.equal(plain, _plain(gate_up[0, :, :1536].contiguous(), w, kind, isa))


class _Block:
    q_size, kv_size = 9 * 64, 3 * 64


@pytest.mark.parametrize("rows", [1, 2, 7])
def test_rope_on_q_and_k_is_torchs_bit_for_bit(bundled, rows):
    """The model's own rotary tables at the positions a prefill chunk and a decode step use."""
    gen = torch.Generator().manual_seed(rows)
    model = bundled.model
    qkv = torch.randn(1, rows, 960, generator=gen) * 4
    start = 300
    cos, sin = model.cos[start:start + rows], model.sin[start:start + rows]
    q, k, _ = roped_heads(_Block, qkv, 9, 3, 64, cos, sin)  # the Python loop's
    got = torch.ops.latency_lab_gemv.rope_qk(qkv[0], cos, sin, 9, 3, 64)  # [R, H + KV, D]
    assert torch.equal(got[:, :9], q[0].transpose(0, 1)) and torch.equal(got[:, 9:], k[0].transpose(0, 1))
