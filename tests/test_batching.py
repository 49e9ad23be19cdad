"""Continuous batching (--max-batch > 1): a request's tokens are the same batched and alone (fp32),
seeded sampling stays reproducible, and cancellation, KV reuse, speculation and errors keep working."""

import time

import pytest
from support import ask, cancel_once_streaming

from engine.cli import build_parser, load_config_from_args
from engine.core.config import GenerationConfig, LoadConfig
from engine.core.errors import InvalidRequest
from engine.platform import capabilities
from engine.serving.scheduler import BatchedDecoding
from engine.serving.service import Engine
from engine.serving.worker import Worker

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=12)
PROMPTS = [
    "Hi.",
    "Name three colors of the rainbow, please.",
    "Write a haiku about the sea, the moon, the stars and a small boat that sails at night.",
    "What is two plus three? Answer with a number and then explain how you got it, step by step.",
]


def _streamed(handle, tokens: int):
    """Read a handle's events until `tokens` tokens have streamed (or it ended)."""
    for event in handle.events(timeout=300):
        if event.kind == "chunk" and event.output_tokens >= tokens or event.kind in ("done", "error"):
            return handle
    return handle


def _staggered(engine, requests, join_after: int = 2):
    """Submit each request once the previous one has streamed `join_after` tokens: they join the
    running batch at different steps. Returns the done events, in order."""
    handles = []
    for messages, config, kw in requests:
        if handles:
            _streamed(handles[-1], join_after)
        handles.append(engine.submit(messages, config, **kw))
    return [h.result(timeout=600) for h in handles]


@pytest.fixture(scope="module")
def batching_bundled(bundled):
    engine = Engine(bundled, max_batch=8)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def batching_tiny(tiny):
    engine = Engine(tiny, max_batch=4)
    yield engine
    engine.close()


def test_max_batch_flag_and_default():
    assert LoadConfig().max_batch == 1
    assert load_config_from_args(build_parser().parse_args(["--max-batch", "8"])).max_batch == 8
    assert load_config_from_args(build_parser().parse_args([])).max_batch == 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidRequest) as err:
            LoadConfig(max_batch=bad)
        assert err.value.param == "max_batch"


def test_both_servers_default_to_the_same_max_batch():
    """`python app.py` and `python -m server` build one parser (server.cli.server_parser): the same
    --max-batch default, which their start line names."""
    import app
    from server.__main__ import build_parser as server_parser
    from server.cli import DEFAULT_MAX_BATCH, start_line

    page, api = app.build_parser().parse_args([]), server_parser().parse_args([])
    assert page.max_batch == api.max_batch == DEFAULT_MAX_BATCH
    assert start_line(api) == f"max batch {DEFAULT_MAX_BATCH}"
    assert start_line(server_parser().parse_args(["--max-batch", "1"])) == "max batch 1"
    assert start_line(server_parser().parse_args(["--backend", "openai"])) == ""  # no local engine


def test_max_batch_1_is_todays_worker(tiny):
    engine = Engine(tiny)
    try:
        assert type(engine.worker) is Worker and engine.worker.max_batch == 1
        assert engine.info().batching is None
        done = engine.complete(ask("Hi."), GREEDY)
        assert "batch_size" not in done.timeline.to_dict() and done.timeline.counters.batching is None
        # strictly one at a time, first come first served, each told its place in line
        prompts = ["Name a color.", "Name a fruit.", "Count to five.", "Say hi."]
        alone = [engine.complete(ask(p), GREEDY).token_ids for p in prompts]
        deadline = time.monotonic() + 30
        while engine.worker.busy and time.monotonic() < deadline:  # the last one leaves after its done event
            time.sleep(0.01)
        handles = [engine.submit(ask(p), GREEDY) for p in prompts]
        tls = [h.result(timeout=300).timeline for h in handles]
        assert [h.final.token_ids for h in handles] == alone
        assert [t.queue_position for t in tls] == [0, 1, 2, 3]
        for earlier, later in zip(tls, tls[1:]):
            assert later.started_ns >= earlier.done_ns
    finally:
        engine.close()


def test_greedy_tokens_equal_batched_and_alone_fp32(batching_bundled):
    """Prompts of different lengths joining at different steps: each reply is token for token
    what the same request gets alone."""
    alone = [batching_bundled.complete(ask(p), GREEDY) for p in PROMPTS]
    batched = _staggered(batching_bundled, [(ask(p), GREEDY, {}) for p in PROMPTS])
    for a, b in zip(alone, batched):
        assert b.token_ids == a.token_ids
        assert b.timeline.counters.batching == "batched"
        assert len(b.timeline.batch_size) == b.output_tokens
        assert b.timeline.batch_size[0] >= 1  # its prefill shared the forward of the running batch
    assert all(a.timeline.batch_size == [1] * a.output_tokens for a in alone)
    assert max(max(b.timeline.batch_size) for b in batched) > 1  # they really were batched
    # batch_prompt_tokens: alone, only the first token's forward carried a prompt (its own uncached part);
    # batched, each request but the last had a later one's prompt ride in some of its decode steps
    for a in alone:
        assert a.timeline.batch_prompt_tokens == [a.timeline.prefill_tokens] + [0] * (a.output_tokens - 1)
    for b in batched:
        assert len(b.timeline.batch_prompt_tokens) == b.output_tokens
        assert b.timeline.batch_prompt_tokens[0] >= b.timeline.prefill_tokens  # its own prompt, maybe others' too
        assert "batch_prompt_tokens" in b.timeline.to_dict()
    for b, joined in zip(batched, batched[1:]):
        assert joined.timeline.prefill_tokens in b.timeline.batch_prompt_tokens[1:]  # the next one's prefill
    info = batching_bundled.info().batching
    assert info["max_batch"] == 8 and info["max_batch_size_seen"] > 1


def test_seeded_sampling_is_reproducible_in_a_batch(batching_tiny):
    configs = [GenerationConfig(temperature=0.9, top_p=0.95, seed=s, max_new_tokens=16) for s in (1, 2, 3)]
    alone = [batching_tiny.complete(ask("Tell me a story."), c) for c in configs]
    batched = _staggered(batching_tiny, [(ask("Tell me a story."), c, {}) for c in configs], join_after=1)
    assert [b.token_ids for b in batched] == [a.token_ids for a in alone]
    assert len({tuple(a.token_ids) for a in alone}) > 1  # each request draws from its own generator


def test_long_prompt_is_prefilled_in_chunks_between_decode_steps(batching_tiny, tokenizer):
    long_text = " ".join(["the cat sat on the mat"] * 60)  # well over one interleave chunk (256 tokens)
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=40)
    short_alone = batching_tiny.complete(ask("Count to twenty."), cfg)
    long_alone = batching_tiny.complete(ask(long_text), GREEDY)
    assert 256 < long_alone.timeline.prompt_tokens < 450
    short = batching_tiny.submit(ask("Count to twenty."), cfg)
    _streamed(short, 2)
    long = batching_tiny.submit(ask(long_text), GREEDY)
    long_done, short_done = long.result(timeout=300), short.result(timeout=300)
    assert long_done.token_ids == long_alone.token_ids and short_done.token_ids == short_alone.token_ids
    ltl, stl = long_done.timeline, short_done.timeline
    during_prefill = [t for t in stl.token_ns if ltl.prefill_start_ns < t < ltl.first_token_ns]
    assert during_prefill  # the short request kept decoding while the long prompt was prefilled


def test_cancel_in_a_batch_leaves_the_others_exact(batching_tiny):
    long_cfg = GenerationConfig(temperature=0.0, max_new_tokens=200)
    ref = batching_tiny.complete(ask("Name a color."), GREEDY)
    doomed = batching_tiny.submit(ask("Write a very long story."), long_cfg)
    _streamed(doomed, 1)
    other = batching_tiny.submit(ask("Name a color."), GREEDY)
    cancel_once_streaming(doomed, after_tokens=4)
    assert doomed.final.detail["finish_reason"] == "cancelled" and doomed.final.output_tokens < 200
    assert other.result(timeout=300).token_ids == ref.token_ids
    early = batching_tiny.submit(ask("Say hi."), GREEDY)  # cancelled at once: ends, whether it had started or not
    early.cancel()
    assert early.result(timeout=300).detail["finish_reason"] == "cancelled"


def test_kv_reuse_in_a_batch(batching_bundled):
    """A sequence may start from a cached prefix while others decode; its tokens do not change."""
    first = ask("Name a fruit.")
    turn1 = batching_bundled.complete(first, GREEDY, session="batch-reuse")
    second = first + [{"role": "assistant", "content": turn1.text}, {"role": "user", "content": "And another?"}]
    fresh = batching_bundled.complete(second, GREEDY.replace(kv_reuse=False))
    done = _staggered(batching_bundled, [(ask(PROMPTS[3]), GREEDY, {}),
                                         (second, GREEDY, {"session": "batch-reuse"})])
    assert done[1].timeline.cached_tokens > 0
    assert done[1].token_ids == fresh.token_ids


def test_speculative_requests_run_unbatched_beside_the_batch(batching_tiny):
    spec = GenerationConfig(temperature=0.0, max_new_tokens=16, speculative="prompt_lookup")
    text = "Repeat: one two three one two three one two three"
    alone = batching_tiny.complete(ask(text), spec)
    plain_alone = batching_tiny.complete(ask("Name a color."), GREEDY)
    done = _staggered(batching_tiny, [(ask("Name a color."), GREEDY, {}), (ask(text), spec, {})], join_after=1)
    assert done[1].token_ids == alone.token_ids and done[0].token_ids == plain_alone.token_ids
    assert done[1].timeline.counters.batching == "unbatched (speculative)"
    assert done[1].timeline.batch_size == [1] * done[1].output_tokens


@pytest.mark.skipif(not capabilities.detect().cpp_compiler, reason="no C++ compiler: the compiled step is refused "
                    "(tests/test_compiled_step.py checks that)")
def test_compiled_step_requests_run_unbatched_beside_the_batch(batching_tiny):
    compiled = GREEDY.replace(max_new_tokens=12, compiled_decode=True)
    alone = batching_tiny.complete(ask("Name a fruit."), compiled)
    done = _staggered(batching_tiny, [(ask("Name a color."), GREEDY, {}), (ask("Name a fruit."), compiled, {})],
                      join_after=1)
    assert done[1].token_ids == alone.token_ids
    assert done[1].timeline.counters.batching == "unbatched (compiled step)"
    assert done[1].timeline.counters.decode_step == "compiled"
    assert done[1].timeline.batch_size == [1] * done[1].output_tokens


def test_a_failing_request_fails_alone(batching_tiny):
    ok = batching_tiny.submit(ask("Name a color."), GREEDY)
    _streamed(ok, 1)
    too_long = batching_tiny.submit(prompt_ids=[5] * 600, config=GREEDY)  # beyond the 512-token window
    with pytest.raises(Exception):
        too_long.result(timeout=300)
    assert ok.result(timeout=300).output_tokens > 0
    assert isinstance(batching_tiny.worker, Worker) and batching_tiny.worker.max_batch == 4
    deadline = time.monotonic() + 30
    while batching_tiny.worker.busy and time.monotonic() < deadline:  # it leaves the batch after its done event
        time.sleep(0.01)
    assert not batching_tiny.worker.busy


def test_under_load_batched_replies_are_exact_and_nothing_is_lost(bundled):
    """The load bench's checks (server/load/) against a batching engine: 6 streaming
    clients, mixed toggles (reuse, sessions, seeded sampling, speculation), some disconnecting."""
    from engine.serving.prefix_cache import PrefixCache
    from server.api import create_api
    from server.load import drive as load_drive
    from server.load import figures as load_figures
    from server.load import pool as load_pool
    from server.run import BackgroundServer

    engine = Engine(bundled, prefix_cache=PrefixCache(12), max_batch=4)
    try:
        with load_drive.MemorySampler(engine.prefix_cache, every=0.1) as sampler, \
                BackgroundServer(create_api(engine)) as url:
            pool = load_pool.build_pool(5, 6, load_pool.offered_toggles(engine))
            load_pool.compute_references(engine, pool)
            result = load_drive.run_load(engine, url, pool, (6,), duration=6, max_requests=24, cancel_every=4,
                                         deadline=300, repeat=1, sampler=sampler, out=lambda *a: None)
        t = result["totals"]
        bad = (*load_figures.BAD, "4xx", "429")
        assert {k: t[k] for k in bad} == {k: 0 for k in bad}, result
        assert t["exact"] >= 6 and result["stuck_workers"] == 0 and result["server_5xx"] == 0
        row = result["rows"][0]
        assert row["batch_size_mean"] > 1  # they were decoded together
        assert 0 < row["with_prompt_share"] <= 1  # newcomers' prompts rode in decode steps
        assert row["itl_ms_with_prompt_p50"] is not None and row["itl_ms_decode_only_p50"] is not None
    finally:
        engine.close()


class FaultyBatched(BatchedDecoding):
    """Seed 4242 fails at its first batched decode step."""

    def step(self):
        if self.config.seed == 4242:
            raise RuntimeError("forced failure mid-batch")
        return super().step()


def test_a_request_failing_mid_batch_fails_alone(tiny):
    engine = Engine(tiny, max_batch=4)
    try:
        engine.worker.decoding_factory = FaultyBatched
        ref = engine.complete(ask("Name a color."), GREEDY)
        ok = engine.submit(ask("Name a color."), GREEDY)
        _streamed(ok, 1)
        bad = engine.submit(ask("Name a fruit."), GREEDY.replace(seed=4242))
        with pytest.raises(Exception, match="forced failure"):
            bad.result(timeout=300)
        assert ok.result(timeout=300).token_ids == ref.token_ids
        assert engine.complete(ask("Name a color."), GREEDY).token_ids == ref.token_ids  # still serving
    finally:
        engine.close()


def test_batch_ceiling_bench_reports_the_ratio_its_own_forward_costs_give(tiny_model_dir):
    """`python -m engine.bench batch_ceiling`: decode and prompt forwards timed alone, and the ceiling
    (P1 + n·d1) / (Pb + n·dB/B) computed from exactly the figures it prints."""
    from engine.bench import batch_ceiling, build_parser

    argv = ["batch_ceiling", "--model", str(tiny_model_dir), "--rounds", "2", "--batch", "3", "--context", "8",
            "--prompt-tokens", "5", "--cached-tokens", "4", "--output-tokens", "6"]
    parser, module = build_parser(argv)
    lines = []
    result = module.run(parser.parse_args(argv), lines.append)
    ms = result["forward_ms"]
    assert set(ms) == {"decode_1", "decode_2", "decode_3", "prompt_alone", "prompt_beside"}
    assert all(v > 0 for v in ms.values()) and result["dtype"] == "fp32"
    assert result["prompt_added_ms"] == round(ms["prompt_beside"] - ms["decode_2"], 2)
    alone, batched = batch_ceiling.request_costs(ms["decode_1"], ms["decode_3"], ms["prompt_alone"],
                                                 result["prompt_added_ms"], 6, 3)
    assert (alone, batched) == (ms["prompt_alone"] + 6 * ms["decode_1"], result["prompt_added_ms"] + 6 * ms["decode_3"] / 3)
    assert result["ceiling"] == result["ratio"] == round(alone / batched, 2)
    assert f"a ceiling of {result['ceiling']}x" in lines[-1]
    with pytest.raises(InvalidRequest, match="at least 2"):
        module.run(parser.parse_args([*argv, "--batch", "1"]), lines.append)


def test_running_counts_every_request_in_the_batch(batching_tiny):
    """GET /v1/queue and the running gauge read Worker.running(): a batch of two counts 2, not 'busy'."""
    long_cfg = GenerationConfig(temperature=0.0, max_new_tokens=200)
    a = batching_tiny.submit(ask("Write a very long story."), long_cfg)
    b = batching_tiny.submit(ask("Write another very long story."), long_cfg)
    _streamed(a, 1)
    _streamed(b, 1)
    assert batching_tiny.worker.running() == 2
    for handle in (a, b):
        handle.cancel()
        handle.result(timeout=300)
    assert batching_tiny.worker.running() == 0
