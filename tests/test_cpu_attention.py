"""Our decode attention kernel (engine/kernels/cpu_attention.py): SDPA's result for every decode row, the
same bits alone and in a batch, the new key and value stored, and SDPA again where it cannot run."""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import cpu_attention
from engine.platform import capabilities
from engine.model.kv_cache import KVCache
from engine.runtime.plan import make_plan
from engine.runtime.runner import Batch, Runner

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (asserted below)")



@pytest.fixture(autouse=True, scope="module")
def _built():
    """Build (or load) the kernels first, whichever test runs alone."""
    cpu_attention.unavailable_reason()

def test_the_kernel_serves_wherever_this_machine_can_build_it():
    reason = cpu_attention.unavailable_reason()
    if CAN_BUILD:
        assert reason is None
    else:
        assert reason


def _caches(lengths, layers, kv, d, gen):
    out = []
    for n in lengths:
        c = KVCache(layers, kv, d, n + 2, torch.float32, "cpu")
        c.k.copy_(torch.randn(c.k.shape, generator=gen))
        c.v.copy_(torch.randn(c.v.shape, generator=gen))
        out.append(c)
    return out


@needs_kernel
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 32), (8, 1, 128)])
def test_every_decode_row_gets_sdpas_attention_and_its_key_and_value_stored(heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(heads * dim)
    lengths = [1, 5, 255, 256, 257, 513, 1000, 2100]  # one chunk, its boundaries, several, runs of them
    caches = _caches(lengths, 3, kv_heads, dim, gen)
    B = len(lengths)
    q = torch.randn(B + 1, heads, dim, generator=gen)  # one row more than sequences, in another order
    k, v = torch.randn(B + 1, kv_heads, dim, generator=gen), torch.randn(B + 1, kv_heads, dim, generator=gen)
    rows = [(3 * b + 1) % (B + 1) for b in range(B)]
    got = cpu_attention.decode_attention(q, k, v, caches, rows, [n - 1 for n in lengths], 2, dim ** -0.5)
    assert got.shape == (B, heads, dim)
    for b, (c, n) in enumerate(zip(caches, lengths)):
        r = rows[b]
        assert torch.equal(c.k[2, 0, :, n - 1], k[r]) and torch.equal(c.v[2, 0, :, n - 1], v[r])
        want = F.scaled_dot_product_attention(q[r][None, :, None], c.k[2, :, :, :n], c.v[2, :, :, :n],
                                              scale=dim ** -0.5, enable_gqa=True)[0, :, 0]
        assert (got[b] - want).abs().max() < 1e-5


@needs_kernel
def test_a_sequence_gets_the_same_bits_alone_and_in_any_batch():
    gen = torch.Generator().manual_seed(7)
    lengths = [700, 3, 300]
    caches = _caches(lengths, 1, 3, 64, gen)
    q, k, v = torch.randn(3, 9, 64, generator=gen), torch.randn(3, 3, 64, generator=gen), torch.randn(3, 3, 64, generator=gen)
    together = cpu_attention.decode_attention(q, k, v, caches, [0, 1, 2], [n - 1 for n in lengths], 0, 0.125)
    for b in range(3):
        alone = cpu_attention.decode_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], [caches[b]], [0],
                                               [lengths[b] - 1], 0, 0.125)
        assert torch.equal(alone[0], together[b])


@needs_kernel
def test_how_chunks_are_grouped_into_tasks_never_changes_the_bits():
    """A task is a run of a head's consecutive chunks, as long as the thread count leaves room for: 1, 2
    and 4 threads cut a 1,400-key sequence's 18 chunks into runs of 4, 3 and 1; each chunk keeps its own
    partial, so every cut gives the same bits (the lossy caches' kernels: tests/test_kv_cache_dtype.py,
    a sequence alone and batched)."""
    gen = torch.Generator().manual_seed(11)
    caches = _caches([1400], 1, 3, 64, gen)
    c = caches[0]
    q, k, v = torch.randn(1, 9, 64, generator=gen), torch.randn(1, 3, 64, generator=gen), torch.randn(1, 3, 64, generator=gen)
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            got.append(cpu_attention.decode_attention(q, k, v, caches, [0], [1399], 0, 0.125))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(got[0], g) for g in got[1:])
    want = F.scaled_dot_product_attention(q[0][None, :, None], c.k[0, :, :, :1400], c.v[0, :, :, :1400], scale=0.125,
                                          enable_gqa=True)[0, :, 0]
    assert (got[0][0] - want).abs().max() < 1e-5


@needs_kernel
def test_the_kernel_refuses_what_it_cannot_take():
    gen = torch.Generator().manual_seed(1)
    (c,) = _caches([4], 1, 3, 64, gen)
    q, kv = torch.randn(1, 9, 64), torch.randn(1, 3, 64)
    with pytest.raises(RuntimeError, match="beyond the cache"):
        cpu_attention.decode_attention(q, kv, kv, [c], [0], [c.capacity], 0, 0.125)
    with pytest.raises(RuntimeError, match="query heads"):
        cpu_attention.decode_attention(torch.randn(1, 10, 64), kv, kv, [c], [0], [1], 0, 0.125)
    with pytest.raises(RuntimeError, match="one entry per sequence"):
        cpu_attention.decode_attention(q, kv, kv, [c, c], [0], [1], 0, 0.125)


@needs_kernel
def test_the_model_decodes_through_it_as_through_sdpa_and_a_batch_keeps_each_sequences_bits(tiny, monkeypatch):
    """One sequence's decode step and a batch's decode rows (next to another sequence's prompt rows)."""
    model = tiny.model
    prompts = [list(range(5, 40)), list(range(50, 61))]

    def run(runner, batched: bool):
        caches = [runner.new_cache(64) for _ in prompts]
        for c, p in zip(caches, prompts):
            runner.forward(torch.tensor(p), c)
        if batched:  # sequence 0 decodes while a third sequence's prompt rides along
            third = runner.new_cache(64)
            return runner.run(Batch([[7], list(range(70, 79)), [9]], [caches[0], third, caches[1]]))[[0, 2]]
        return torch.cat([runner.run(Batch([[t]], [c])) for t, c in zip((7, 9), caches)])

    ours = Runner(model, make_plan(model))
    assert ours.plan.attention == cpu_attention.PLAN_NAME
    ours_alone, ours_batched = run(ours, False), run(ours, True)
    assert torch.equal(ours_alone, ours_batched)  # the batching promise: same bits (packed matmuls both ways)
    monkeypatch.setenv("LATENCY_LAB_ATTENTION", "off")
    sdpa = Runner(model, make_plan(model))  # a plan made with the switch off
    assert sdpa.plan.attention == "sdpa"
    sdpa_alone, sdpa_batched = run(sdpa, False), run(sdpa, True)
    assert torch.equal(sdpa_alone, sdpa_batched)
    assert (ours_alone - sdpa_alone).abs().max() < 1e-4 * sdpa_alone.abs().max()


def test_turned_off_engine_info_says_sdpa_and_why(monkeypatch, bundled_engine, bundled):
    want = cpu_attention.NAME if CAN_BUILD else f"{cpu_attention.SDPA} ({cpu_attention.unavailable_reason()})"
    assert bundled_engine.info().decode_attention == want
    monkeypatch.setenv("LATENCY_LAB_ATTENTION", "off")  # a plan made now: its reason says why
    assert make_plan(bundled.model).attention_text == f"{cpu_attention.SDPA} (turned off (LATENCY_LAB_ATTENTION=off))"


def test_shapes_the_kernel_does_not_take_go_to_sdpa(tiny):
    assert cpu_attention.shape_reason(9, 3, 20)  # head_dim not a multiple of 8
    assert cpu_attention.shape_reason(16, 1, 64)  # 16 query heads on one KV head
    assert cpu_attention.shape_reason(9, 3, 64) is None
    assert (make_plan(tiny.model).attention == cpu_attention.PLAN_NAME) == CAN_BUILD  # fp32 caches on CPU
    assert make_plan(tiny.model, device="meta").attention == "sdpa"  # our kernel serves the CPU
