"""The static decode step a GPU's CUDA graphs capture (engine/runtime/cuda_graph.py), checked on CPU:
the same function run uncaptured must give the eager forward's logits and KV, keep every borrowed
cache's KV intact while sequences move between pool rows and buckets, and never read a tensor's
value on the host (which a graph cannot hold). Capture itself needs CUDA: `python -m engine.bench gpu`."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.core.config import GenerationConfig
from engine.runtime import cuda_graph, eager, plan
from engine.runtime.plan import make_plan
from engine.runtime.runner import Runner
from engine.serving import scheduler

ATOL = 2e-4  # fp32; masked attention over the whole bucket sums in another order than the exact prefix


def forward(model, rows, caches, all_logits=False):
    """The eager forward with the model's plan."""
    return eager.forward(model, make_plan(model), rows, caches, all_logits)


def _static(model):
    return cuda_graph.StaticDecode(model, make_plan(model))


def _prefilled(model, prompts):
    caches = []
    for ids in prompts:
        cache = model.new_cache(len(ids) + 40)
        forward(model, [torch.tensor(ids)], [cache])
        caches.append(cache)
    return caches


def _kv(cache):
    return cache.k[:, :, :, : cache.length].clone(), cache.v[:, :, :, : cache.length].clone()


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny.model)  # its own copy, away from the session's model


def test_buckets_are_powers_of_two_within_the_context_window():
    assert cuda_graph.bucket(1, 2048) == cuda_graph.MIN_BUCKET
    assert cuda_graph.bucket(cuda_graph.MIN_BUCKET + 1, 2048) == 2 * cuda_graph.MIN_BUCKET
    assert cuda_graph.bucket(2000, 2048) == 2048
    assert cuda_graph.bucket(1500, 1000) is None
    assert cuda_graph.bucket(900, 1000) == 1000  # capped at a window that is not a power of two


def test_the_static_step_gives_the_eager_forwards_logits_and_kv(model):
    prompts = [[1, 5, 9, 13], [2, 3, 4, 5, 6, 7, 8, 9, 10], [11]]
    static_caches, eager_caches = _prefilled(model, prompts), _prefilled(model, prompts)
    static = _static(model)
    tokens = [[21, 22, 23], [31, 32, 33], [41, 42, 43]]
    for step in range(3):
        toks = [t[step] for t in tokens]
        got = static.step(toks, static_caches, replay=False)
        want = forward(model, [[t] for t in toks], eager_caches)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    for s, e in zip(static_caches, eager_caches):
        assert s.length == e.length
        for a, b in zip(_kv(s), _kv(e)):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    pool = static.pools[cuda_graph.MIN_BUCKET]
    assert [pool.row_of(c) for c in static_caches] == [0, 1, 2]  # borrowed rows: the caches are views


def test_a_borrowed_cache_keeps_working_in_the_eager_forward(model):
    """A sequence whose KV lives in a pool row still takes prompt chunks and multi-token verifies."""
    (borrowed,), (plain,) = _prefilled(model, [[1, 2, 3]]), _prefilled(model, [[1, 2, 3]])
    static = _static(model)
    static.step([7], [borrowed], replay=False)
    forward(model, [[7]], [plain])
    got = forward(model, [torch.tensor([8, 9, 10])], [borrowed], all_logits=True)
    want = forward(model, [torch.tensor([8, 9, 10])], [plain], all_logits=True)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert static.pools[cuda_graph.MIN_BUCKET].row_of(borrowed) == 0


def test_sequences_displaced_or_padded_keep_their_kv(model):
    """Four sequences step, then two others: rows 0-1 are lent to the newcomers (the old holders get
    copies of their KV), and three sequences pad to four rows, whose padding row writes only scratch."""
    static = _static(model)
    first = _prefilled(model, [[1, 2], [3, 4, 5], [6], [7, 8, 9, 10]])
    static.step([11, 12, 13, 14], first, replay=False)
    before = [_kv(c) for c in first]
    second = _prefilled(model, [[20, 21], [22]])
    static.step([15, 16], second, replay=False)
    pool = static.pools[cuda_graph.MIN_BUCKET]
    assert [pool.row_of(c) for c in second] == [0, 1]
    assert pool.row_of(first[0]) is None and pool.row_of(first[1]) is None  # taken back: their own copies now
    padding_owner = first[3]  # row 3: the padding row of the next step's three sequences (rows 0-2)
    kept = _kv(padding_owner)
    static.step([30, 31, 32], [first[2], second[1], second[0]], replay=False)
    assert [pool.row_of(c) for c in (second[0], second[1], first[2], padding_owner)] == [0, 1, 2, 3]
    for cache, (k, v) in zip(first[:2], before[:2]):
        torch.testing.assert_close(_kv(cache)[0], k, atol=0, rtol=0)
        torch.testing.assert_close(_kv(cache)[1], v, atol=0, rtol=0)
    torch.testing.assert_close(_kv(padding_owner)[0], kept[0], atol=0, rtol=0)
    torch.testing.assert_close(_kv(padding_owner)[1], kept[1], atol=0, rtol=0)


def test_a_sequence_at_the_end_of_its_bucket_moves_to_the_next(model):
    static = _static(model)
    n = cuda_graph.MIN_BUCKET - 1  # its next position would be the scratch one
    ids = [int(i % 50) + 1 for i in range(n)]
    (cache,), (plain,) = _prefilled(model, [ids[:8]]), _prefilled(model, [ids[:8]])
    static.step([3], [cache], replay=False)
    forward(model, [[3]], [plain])
    for c in (cache, plain):
        forward(model, [torch.tensor(ids[8 : n - 1])], [c])
    assert cache.length == n and not cuda_graph.fits(cache, cuda_graph.MIN_BUCKET)
    got, want = static.step([4], [cache], replay=False), forward(model, [[4]], [plain])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert static.pools[2 * cuda_graph.MIN_BUCKET].row_of(cache) == 0


class _HostReads(TorchDispatchMode):
    """Records ops that hand a tensor's value to the host (int(), .item(), bool(), nonzero)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.startswith(("_local_scalar_dense", "nonzero", "item")):
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_step_never_reads_a_value_on_the_host(model):
    """What a CUDA graph cannot capture: a step that asks the device for a number (a sync)."""
    static = _static(model)
    caches = _prefilled(model, [[1, 2, 3], [4, 5]])
    static.step([6, 7], caches, replay=False)  # placed in rows 0-1
    pool = static.pools[cuda_graph.MIN_BUCKET]
    with torch.inference_mode(), _HostReads() as mode:
        static._step(pool, 2)
    assert mode.reads == []


def test_a_cpu_model_never_takes_the_static_step_and_graphs_refuse_cleanly(model):
    assert make_plan(model).step_modes["static"]  # on CPU the plan runs one-token steps eagerly (exact attention)
    static = _static(model)
    caches = _prefilled(model, [[1, 2, 3]])
    logits = static.step([5], caches, replay=True)  # no CUDA: the uncaptured step, the reason kept
    assert logits.shape[0] == 1 and "CUDA" in static.failed
    assert static.describe()["failed"] == static.failed


def test_compiled_requests_batch_on_a_gpu_in_groups_of_their_own(model):
    compiled, plain = GenerationConfig(compiled_decode=True), GenerationConfig()
    cpu = Runner(model, make_plan(model))
    assert scheduler.why_unbatched(compiled, cpu) == "compiled step"  # CPU: Inductor's one-sequence graph
    gpu = Runner(model, make_plan(model, device="cuda"))  # a plan for a GPU (nothing run)
    assert scheduler.why_unbatched(compiled, gpu) is None
    assert cuda_graph.serves([1, 1, 1], all_logits=False)
    assert not cuda_graph.serves([1, 4], all_logits=False)  # a prompt chunk: the eager forward

    class Dec:
        def __init__(self, config):
            self.runner, self.config = gpu, config
            self.mode = "compiled" if config.compiled_decode else "eager"

    seqs = [scheduler.Sequence(handle=None, waiting=Dec(c)) for c in (compiled, plain, compiled, plain, plain)]
    groups = scheduler.waiting_groups(seqs, max_batch=8)
    assert sorted(len(g) for g in groups) == [2, 3]
    assert all(len({s.waiting.config.compiled_decode for s in g}) == 1 for g in groups)


def test_the_gpus_prefix_mask_is_the_cpus_boolean_mask():
    """After a cached prefix, a GPU's prompt rows take a lower-right causal bias (flash kernels take it;
    a boolean mask rules them out): it must mask exactly what the CPU's boolean mask does."""
    import torch.nn.functional as F

    from engine.runtime.eager import _prefix_causal

    gen = torch.Generator().manual_seed(0)
    start, n, heads, kv_heads = 7, 5, 6, 2
    q = torch.randn(1, heads, n, 16, generator=gen)
    k, v = torch.randn(2, 1, kv_heads, start + n, 16, generator=gen)
    boolean = _prefix_causal(start, n, torch.device("cpu"))
    bias = _prefix_causal.__globals__["causal_lower_right"](n, start + n)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=boolean, enable_gqa=True)
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert torch.equal(bias._materialize(torch.device("cpu")), boolean)


def test_the_worker_serves_through_the_static_step_as_a_gpu_would(tiny, monkeypatch):
    """The static step forced onto CPU (as CUDA takes it): requests alone and batched through the
    worker, with KV reuse handing borrowed caches between turns, reply what the eager forward replies."""
    from engine.serving.service import Engine

    prompts = ["Hi.", "Name three colors.", "Count to five, please.", "What is two plus three?"]
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=10)

    def replies(engine, together: bool, session: str | None = None):
        messages = [[{"role": "user", "content": p}] for p in prompts]
        if not together:
            return [engine.complete(m, cfg, session=session).token_ids for m in messages]
        handles = [engine.submit(m, cfg, session=session) for m in messages]
        return [h.result(timeout=600).token_ids for h in handles]

    model = copy.deepcopy(tiny.model)
    loaded = copy.copy(tiny)
    loaded.model = model
    engine = Engine(loaded, max_batch=4)
    try:
        eager = replies(engine, together=False)
    finally:
        engine.close()
    steps = []
    real_step, real_modes = cuda_graph.StaticDecode.step, plan._step_modes

    def static_on_cpu(*args):  # the plan of a CPU model with the static step as a GPU's plan has it
        modes, machine = real_modes(*args)
        return {**modes, "static": None}, machine

    monkeypatch.setattr(plan, "_step_modes", static_on_cpu)
    monkeypatch.setattr(cuda_graph.StaticDecode, "step",
                        lambda self, tokens, caches, replay: steps.append(len(caches)) or real_step(self, tokens, caches, replay))
    engine = Engine(loaded, max_batch=4)
    try:
        alone, batched = replies(engine, together=False), replies(engine, together=True)
        turn1 = replies(engine, together=False, session="s")  # KV kept (borrowed rows) and reused next turn
        turn2 = replies(engine, together=True, session="s")
    finally:
        engine.close()
    assert alone == eager and batched == eager and turn1 == eager and turn2 == eager
    assert max(steps) > 1 and 1 in steps  # batched static steps and lone ones both ran
    assert engine.variants.default.runner.compiled_info()["graphs"]["pools"]  # its pools held the sequences' KV


def test_a_failed_capture_refuses_the_toggle_once_checked(model, tiny, monkeypatch):
    """prepare's GPU branch (a plan for CUDA: the toggle captures the static step) checks the graph step
    once; where capture fails (here: no CUDA device), the toggle is refused with the reason, at once on
    later requests."""
    from engine.core.errors import InvalidRequest
    from engine.runtime import compiled

    checks = []
    real_check = compiled.check
    monkeypatch.setattr(compiled, "check", lambda *a, **k: checks.append(1) or real_check(*a, **k))
    runner = Runner(model, make_plan(model, device="cuda"))  # the plan a GPU would make; the model stays on CPU
    assert runner.plan.compiled_mode == "cuda_graph" and runner.setup_stage == "capture"
    for _ in range(2):
        with pytest.raises(InvalidRequest) as err:
            runner.prepare("compiled", tiny.tokenizer, 64)
        assert "CUDA graphs need a CUDA device" in str(err.value) and err.value.param == "compiled_decode"
    info = runner.compiled_info()
    assert checks == [1] and info["positions"] > 0  # checked once; the second refusal came at once
    assert info["graphs"]["failed"] and not any(p["graphs"] for p in info["graphs"]["pools"].values())
