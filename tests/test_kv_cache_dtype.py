"""KV cache precision (the kv_cache_dtype toggle): the cache at each precision, our kernel reading it against
SDPA over the same cache dequantized, the plan's choice, the bytes the roofline counts, and the invariants
that hold at a lossy precision too (a sequence's bits alone and batched, KV reuse). Greedy identity with
the model-dtype cache is NOT promised for the lossy precisions: they are named below, once, explicitly."""

import pytest
import torch
import torch.nn.functional as F

from engine.core.config import KV_CACHE_DTYPES, LOSSY_KV_CACHE_DTYPES, TOGGLE, GenerationConfig
from engine.core.errors import InvalidRequest
from engine.kernels import cpu_attention
from engine.model.kv_cache import KVCache, bytes_per_position
from engine.platform import capabilities
from engine.runtime.plan import make_plan
from engine.runtime.runner import Batch, Runner
from engine.serving.prefix_cache import PrefixCache

CAN_BUILD = (capabilities.detect().torch_cpu_capability in ("AVX2", "AVX512")
             and bool(capabilities.detect().cpp_compiler))
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason="needs AVX2 and a C++ compiler (asserted below)")
# The precisions that change the numbers, by name: the greedy-identity invariant excludes exactly these.
LOSSY = ("fp16", "bf16", "int8")
GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=12)


@pytest.fixture(autouse=True, scope="module")
def _built():
    """Build (or load) the kernels first, whichever test runs alone."""
    cpu_attention.kv_unavailable_reason()


def test_the_kernel_reads_other_precisions_wherever_this_machine_can_build_it():
    assert (cpu_attention.kv_unavailable_reason() is None) == CAN_BUILD


def test_the_toggle_is_declared_once_with_its_lossy_choices_named():
    t = TOGGLE["kv_cache_dtype"]
    assert t.default == "model" and t.choices == KV_CACHE_DTYPES == ("model", *LOSSY)
    assert LOSSY_KV_CACHE_DTYPES == LOSSY and not t.keeps_reply  # the A/B replies check reads it as lossy
    assert "not promised" in t.help and "Lossy" in t.help  # the page's hover and the glossary tab say so
    assert t.describe("int8") == "kv int8" and t.describe("model") is None
    with pytest.raises(InvalidRequest) as err:
        GenerationConfig(kv_cache_dtype="fp8")
    assert err.value.param == "kv_cache_dtype"
    with pytest.raises(InvalidRequest) as err:
        GenerationConfig(kv_cache_dtype="int8", compiled_decode=True)
    assert err.value.param == "kv_cache_dtype" and "turn one of them off" in str(err.value)


def test_the_cache_keeps_each_precision_and_counts_its_bytes():
    x = torch.randn(1, 3, 5, 64, generator=torch.Generator().manual_seed(0))
    for kind in KV_CACHE_DTYPES:
        c = KVCache(2, 3, 64, 4, torch.float32, "cpu", kind)
        c.ensure_capacity(7)  # grows every buffer, scales too
        c.store(1, 2, x, -x)
        c.length = 7
        k, v = c.read(1, 7)
        assert k.dtype == torch.float32 and k.shape == (1, 3, 7, 64)
        err = (k[:, :, 2:] - x).abs().max()
        assert err == 0 if kind == "model" else err < (0.02 if kind != "bf16" else 0.05) * x.abs().max()
        assert torch.equal(v[:, :, 2:], -k[:, :, 2:])  # symmetric rounding
        copy = c.copy_prefix(7, capacity=9)
        assert copy.kind == kind and copy.capacity == 9 and torch.equal(copy.read(1, 7)[0][:, :, 2:], k[:, :, 2:])
        per = bytes_per_position(kind, torch.float32, 2, 3, 64)
        assert c.nbytes() == 7 * per and per == 2 * 2 * 3 * {"model": 256, "fp16": 128, "bf16": 128, "int8": 68}[kind]
    assert c.allocated_bytes() == 2 * (2 * 3 * 7 * 64 + 2 * 3 * 7 * 4)  # int8 values + fp32 scales, capacity 7


def _caches(kind, lengths, gen, layers=2, kv=3, d=64):
    out = []
    for n in lengths:
        c = KVCache(layers, kv, d, n + 2, torch.float32, "cpu", kind)
        for i in range(layers):
            c.store(i, 0, torch.randn(1, kv, n + 2, d, generator=gen), torch.randn(1, kv, n + 2, d, generator=gen))
        c.length = n + 2
        out.append(c)
    return out


@needs_kernel
@pytest.mark.parametrize("kind", LOSSY)
def test_the_kernel_reads_each_precision_as_sdpa_over_the_dequantized_cache(kind):
    """Every decode row attends as SDPA over the cache dequantized (the kernel widens on the fly), its new key
    and value stored as KVCache.store would (same bits), and a sequence's bits alone equal its bits batched."""
    gen = torch.Generator().manual_seed(3)
    lengths = [1, 5, 256, 257, 700]
    caches = _caches(kind, lengths, gen)
    B = len(lengths)
    q, k, v = (torch.randn(1, h, B, 64, generator=gen) for h in (9, 3, 3))
    got = cpu_attention.decode_attention_kv(q, k, v, caches, range(B), [n - 1 for n in lengths], 1, 0.125)
    for b, (c, n) in enumerate(zip(caches, lengths)):
        ref = KVCache(2, 3, 64, 1, torch.float32, "cpu", kind)
        ref.store(0, 0, k[:, :, b : b + 1], v[:, :, b : b + 1])
        keys, values = c.read(1, n)
        assert torch.equal(keys[:, :, n - 1 :], ref.read(0, 1)[0]) and torch.equal(values[:, :, n - 1 :], ref.read(0, 1)[1])
        want = F.scaled_dot_product_attention(q[:, :, b : b + 1], keys, values, scale=0.125, enable_gqa=True)[0, :, 0]
        assert (got[b] - want).abs().max() < 1e-5 * max(1.0, float(want.abs().max()))
        alone = cpu_attention.decode_attention_kv(q[:, :, b : b + 1], k[:, :, b : b + 1], v[:, :, b : b + 1],
                                                  [c.copy_prefix(n - 1, n + 2)], [0], [n - 1], 1, 0.125)
        assert torch.equal(alone[0], got[b])


def test_the_plan_names_what_reads_each_precision(tiny):
    plan = make_plan(tiny.model)
    assert plan.attention_for("model") == plan.attention
    want = cpu_attention.PLAN_NAME_KV if CAN_BUILD else "sdpa"
    assert all(plan.attention_for(kv) == want for kv in LOSSY)
    assert plan.loop_rows(["model", "model"]) == plan.loop_rows(["model", "int8", "bf16"]) == plan.cpp_rows
    assert (plan.cpp_rows > 0) == CAN_BUILD and set(plan.loop_kv) == (set(KV_CACHE_DTYPES) if CAN_BUILD else set())
    assert plan.describe()["loop_kv"] == list(plan.loop_kv)
    assert plan.describe()["kv_attention"] == {kv: want for kv in LOSSY}
    meta = make_plan(tiny.model, device="meta")
    assert meta.attention_for("int8") == "sdpa" and "fp32 activations on CPU" in meta.kv_attention_text


@needs_kernel
def test_a_mixed_batch_keeps_each_sequences_bits_and_the_kernel_agrees_with_sdpa(tiny, monkeypatch):
    """int8, fp16 and model-dtype sequences decoding in one forward beside a prompt get the bits they get
    alone; the kernel's int8 step is SDPA-over-dequantized's within rounding."""
    model = tiny.model
    prompts = {"int8": list(range(5, 40)), "fp16": list(range(50, 61)), "model": list(range(90, 97))}

    def run(runner, batched):
        caches = {kv: runner.new_cache(64, kv) for kv in prompts}
        for kv, p in prompts.items():
            runner.forward(torch.tensor(p), caches[kv])
        if batched:
            extra = runner.new_cache(64, "int8")
            logits = runner.run(Batch([[7], list(range(70, 79)), [8], [9]],
                                      [caches["int8"], extra, caches["fp16"], caches["model"]]))
            return logits[[0, 2, 3]]
        return torch.cat([runner.run(Batch([[t]], [caches[kv]])) for t, kv in zip((7, 8, 9), prompts)])

    ours = Runner(model, make_plan(model))
    alone, batched = run(ours, False), run(ours, True)
    assert torch.equal(alone, batched)
    monkeypatch.setenv("LATENCY_LAB_ATTENTION", "off")
    sdpa = Runner(model, make_plan(model))
    assert sdpa.plan.attention_for("int8") == "sdpa"
    assert (alone - run(sdpa, False)).abs().max() < 1e-4 * alone.abs().max()


def test_a_prefix_cache_entry_is_served_only_at_its_own_precision(tiny):
    cache = PrefixCache()
    model_key, int8_key = cache.key_for(tiny.model), cache.key_for(tiny.model, "int8")
    assert model_key != int8_key and cache.key_for(tiny.model, "int8") == int8_key
    kv = tiny.model.new_cache(8, "int8")
    kv.length = 6
    assert cache.insert(int8_key, "s", list(range(6)), kv)
    assert cache.lookup(model_key, "s", list(range(8))).cached_tokens == 0
    with cache.lookup(int8_key, "s", list(range(8))) as lease:
        assert lease.cached_tokens == 6
    assert cache.drop(model_key) == 1  # a model's entries go at every precision


def test_the_generic_forward_refuses_another_precision_by_name(tiny_model_dir):
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.runtime.runner import open_runner

    runner = open_runner(load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", device="cpu", progress=False,
                                         fast_path=False)))
    runner.new_cache(4)  # the model's own precision: as ever
    with pytest.raises(InvalidRequest) as err:
        runner.new_cache(4, "int8")
    assert err.value.param == "kv_cache_dtype" and "kv_cache_dtype=model" in str(err.value)


def _reply(engine, messages, **config):
    return engine.complete(messages, GREEDY.replace(**config))


def test_model_kv_is_the_default_greedy_reply_and_lossy_kv_keeps_its_own_invariants(bundled_engine):
    """The greedy-identity invariant holds for kv_cache_dtype=model (the one lossless choice); the LOSSY ones
    are excluded from it by name. What every precision keeps: KV reuse changes no token of its reply, and the
    roofline counts its own bytes."""
    ask = [{"role": "user", "content": "Name three rivers in Europe and say where each one flows."}]
    default = _reply(bundled_engine, ask)
    assert _reply(bundled_engine, ask, kv_cache_dtype="model").token_ids == default.token_ids  # lossless: identical
    per_position = {}
    for kv in LOSSY:  # lossy: identity with the model-dtype reply is not promised, nor asserted
        cold = _reply(bundled_engine, ask, kv_cache_dtype=kv, kv_reuse=False)
        session = f"kv-{kv}"
        first = bundled_engine.complete(ask, GREEDY.replace(kv_cache_dtype=kv), session=session)
        follow = ask + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And in Asia?"}]
        warm = bundled_engine.complete(follow, GREEDY.replace(kv_cache_dtype=kv), session=session)
        fresh = _reply(bundled_engine, follow, kv_cache_dtype=kv, kv_reuse=False)
        assert first.token_ids == cold.token_ids and warm.timeline.cached_tokens > 0
        assert warm.token_ids == fresh.token_ids, f"KV reuse changed a {kv} reply"
        assert warm.timeline.kv_cache_dtype == kv
        per_position[kv] = warm.timeline.kv_bytes_per_position
    assert default.timeline.kv_bytes_per_position == 2 * per_position["fp16"] == 2 * per_position["bf16"]
    assert per_position["int8"] < per_position["fp16"]


def test_the_openai_sdk_sets_the_kv_precision(bundled_engine):
    import openai
    from support import ask, served

    with served(bundled_engine) as (url, rec, name):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model=name, messages=ask("Name a color."), max_tokens=6,
                                               temperature=0, extra_body={"kv_cache_dtype": "int8"})
        assert reply.choices[0].message.content
        assert rec.handles[-1].request.config.kv_cache_dtype == "int8"
        assert rec.handles[-1].final.timeline.kv_cache_dtype == "int8"
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=name, messages=ask("hi"), max_tokens=2,
                                           extra_body={"kv_cache_dtype": "int4"})
        assert "kv_cache_dtype" in str(err.value) and "model, fp16, bf16, int8" in str(err.value)


def test_bench_kv_prints_agreement_and_decode_per_precision(tmp_path, tokenizer):
    """`python -m engine.bench kv --kv-dtypes ...` on a tiny model with room for the long prompts: every
    precision's agreement with the model-dtype cache and its decode speed short and long, side by side."""
    from conftest import build_tiny_model_dir

    from engine.bench import build_parser

    model_dir = build_tiny_model_dir(tmp_path / "tiny2k", tokenizer, max_position_embeddings=2048)
    argv = ["kv", "--model", str(model_dir), "--dtype", "fp32", "--kv-dtypes", "int8,fp16", "--prompts-long", "2",
            "--rounds", "1", "--last-tokens", "4", "--python-loop"]
    p, kv = build_parser(argv)
    lines = []
    result = kv.run(p.parse_args(argv), lambda *a: lines.append(" ".join(map(str, a))))
    rows = result["kv_dtypes"]
    loops = [f"{kv} python loop" for kv in ("model", "int8", "fp16")]  # --python-loop: timed beside, alternating
    assert list(rows) == ["model", "int8", "fp16", *loops] and result["ratio"] == rows["int8"]["long_vs_short"]
    assert all(rows[name]["decode_tps_long"] > 0 and "greedy_agreement" not in rows[name] for name in loops)
    assert any(line.startswith("plan's loop / Python loop") and "int8" in line for line in lines)
    assert rows["model"]["greedy_agreement"] == rows["model"]["top1_agreement"] == 1.0  # itself
    for kv_dtype, row in list(rows.items())[:3]:
        assert 0 <= row["greedy_agreement"] <= 1 and 0 <= row["top1_agreement"] <= 1 and row["positions"] > 0
        assert row["decode_tps_short"] > 0 and row["decode_tps_long"] > 0
        assert any(line.lstrip().startswith(f"{kv_dtype}: greedy agreement") for line in lines)
    assert rows["int8"]["kv_mb_long"] < rows["fp16"]["kv_mb_long"] < rows["model"]["kv_mb_long"]
    # the bytes bound beside each ratio: fewer KV bytes a position, a bound nearer 1
    assert 0 < rows["model"]["bytes_bound"] < rows["fp16"]["bytes_bound"] < rows["int8"]["bytes_bound"] < 1
    assert result["bytes_bound"] == rows["int8"]["bytes_bound"]
    assert any(line.lstrip().startswith("int8:") and f"bytes bound {rows['int8']['bytes_bound']:.2f}x" in line
               for line in lines)
    assert min(result["long_prompt_tokens"]) > 1300
