"""The one clock (engine/core/clock.py): the Timeline and every bench take their times through it,
and each timed interval ends in a done-stamp on the device of the model it times.

No GPU here: the clock's test hook (`clock.listeners`) records every wait asked for, CPU ones too;
a model-like on the "meta" device (OnMeta) shows that a bench's inputs and stamps follow the model's
device rather than the host; where a CUDA call is the point, torch.cuda's function is replaced by a
recorder. No time is asserted.
"""

from __future__ import annotations

import ast
import math
import threading
from pathlib import Path

import pytest
import torch

from engine.core import clock
from engine.bench import runner_for

CPU, META = torch.device("cpu"), torch.device("meta")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def waits(monkeypatch):
    """The device of every wait the test asked of the clock, in order: from its own thread and the
    threads it starts, not from threads already running (a session engine's worker doing idle work)."""
    seen, others = [], {t for t in threading.enumerate() if t is not threading.current_thread()}
    monkeypatch.setattr(clock, "listeners", [lambda d: seen.append(d) if threading.current_thread() not in others else None])
    return seen


@pytest.fixture(scope="module")
def own_tiny(tiny_model_dir):
    """A tiny model of this module's own (benches pack its weights and swap its kernel plan)."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    return load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))


class OnMeta:
    """A runner-like that says its model is on the "meta" device, over a real CPU runner: it records the
    device of every input it is given, and the real runner computes with CPU ids of the same shape."""

    device = META

    def __init__(self, runner):
        self.runner, self.model, self.inputs = runner, getattr(runner, "model", None), []

    def new_cache(self, capacity: int):
        return self.runner.new_cache(capacity)

    def forward(self, ids, cache, all_logits: bool = False, mode: str = "eager"):
        self.inputs.append(ids.device)
        return self.runner.forward(torch.full(tuple(ids.shape), 7, dtype=torch.long), cache, all_logits, mode)

    def __getattr__(self, name):  # plan, vocab_size...: the real runner's
        return getattr(self.runner, name)


def parse(scenario: str, *flags: str, model_dir=None):
    from engine.bench import build_parser

    argv = [scenario, *(["--model", str(model_dir)] if model_dir else []), "--dtype", "fp32", *flags]
    p, module = build_parser(argv)
    return p.parse_args(argv), module


# --- the clock ------------------------------------------------------------------------------------


def test_the_clock_counts_every_wait_and_names_the_device(waits):
    before = clock.syncs
    clock.sync("cpu")
    clock.sync(torch.zeros(2))  # a tensor: its device
    clock.sync(torch.nn.Linear(2, 2))  # a module without .device: its first parameter's
    clock.sync(OnMeta(None))  # anything with .device
    assert clock.syncs - before == 4
    assert waits == [CPU, CPU, CPU, META]
    clock.sync(None)  # no device: no wait, not counted
    assert clock.done_ns(None) > 0 and clock.syncs - before == 4
    with pytest.raises(TypeError):
        clock.sync(object())


def test_a_done_stamp_on_cuda_is_read_after_torch_cuda_synchronize(monkeypatch, waits):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append((d, clock.now_ns())))
    stamp = clock.done_ns("cuda:0")
    assert [d for d, _ in synced] == [torch.device("cuda:0")]
    assert synced[0][1] <= stamp  # wait, then read
    clock.done_s(torch.device("cpu"))  # nothing to wait for on CPU
    assert len(synced) == 1 and waits == [torch.device("cuda:0"), CPU]


def test_the_timeline_stamps_on_the_clock():
    from engine.core import timeline

    assert timeline.now_ns is clock.now_ns  # the engine's modules import it from the Timeline
    a = clock.now_ns()
    tl = timeline.Timeline()
    tl.mark("done")
    tl.add_tokens(1)
    b = clock.now_ns()
    assert a <= tl.received_ns <= tl.done_ns <= tl.token_ns[0] <= b


def test_each_token_stamp_of_a_reply_follows_a_wait_on_the_models_device(tiny, monkeypatch):
    from engine.bench import run_request
    from engine.core.config import GenerationConfig

    at = []  # (when, device) of each wait
    monkeypatch.setattr(clock, "listeners", [lambda d: at.append((clock.now_ns(), d))])
    config = GenerationConfig(temperature=0.0, max_new_tokens=5, chunked_prefill=True, prefill_chunk_tokens=16)
    done = run_request(tiny, None, config, prompt_ids=list(range(100, 140)))
    tl = done.timeline
    assert tl.output_tokens == 5 and {d for _, d in at} == {tiny.device}
    previous = tl.prefill_start_ns
    for t in tl.token_ns:  # between the previous stamp and this one the device was waited for
        assert any(previous <= w <= t for w, _ in at)
        previous = t


# --- the benches ----------------------------------------------------------------------------------


def test_no_bench_reads_the_time_but_through_the_clock():
    """perf_counter & co. only in engine/core/clock.py: a bench reading the time itself would stamp
    launches on a GPU. (time.process_time, CPU time, is no clock of device work.)"""
    banned = {"perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic", "monotonic_ns"}
    others = {"report.py", "report_render.py", "gpu.py"}  # not measured here: the suite and the GPU check
    offenders = []
    for path in sorted((ROOT / "engine" / "bench").glob("*.py")):
        if path.name in others:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in banned and getattr(node.value, "id", None) == "time":
                offenders.append(f"{path.name}:{node.lineno} time.{node.attr}")
    assert not offenders


def test_bench_quant_steps_times_each_step_between_done_stamps_on_the_models_device(tiny, waits):
    from engine.bench.quant_steps import step_times

    model = OnMeta(runner_for(tiny))
    times = step_times({"a": model, "b": model}, context=6, rounds=2, steps=2, device=model.device)
    intervals = sum(len(t) for t in times.values())
    assert intervals == 8 and len(waits) >= 2 * intervals and set(waits) == {META}
    assert set(model.inputs) == {META}  # the ids too are on the model's device


def test_bench_quant_steps_counterbalances_the_models_turns():
    from engine.bench.quant_steps import step_times

    turns = []

    class Fake:  # a model-like that records whose turn each step was
        def __init__(self, name):
            self.name = name

        def new_cache(self, capacity):
            return type("Cache", (), {"crop": lambda self, n: None})()

        def forward(self, ids, cache):
            if len(ids) == 1:
                turns.append(self.name)

    step_times({n: Fake(n) for n in "abc"}, context=4, rounds=3, steps=2, device=torch.device("cpu"))
    assert "".join(turns) == "aabbcc" "ccbbaa" "aabbcc"


def test_bench_verify_feeds_the_models_device_and_stamps_it(own_tiny, monkeypatch, waits):
    from engine.bench import verify

    made = []
    real = verify.runners_for
    monkeypatch.setattr(verify, "load_model", lambda args: own_tiny)
    monkeypatch.setattr(verify, "runners_for", lambda model, names: {
        n: made.append(OnMeta(r)) or made[-1] for n, r in real(model, names).items()})
    args, _ = parse("verify", "--context", "8", "--tokens", "1,2", "--rounds", "2")
    result = verify.run(args, lambda *a: None)
    plans = (len(result["rows"][0]) - 1) // 2  # each plan's ms and steps beside "tokens"
    intervals = 2 * 2 * plans  # rounds x sizes x plans
    inputs = [d for m in made for d in m.inputs]
    assert len(made) == plans and set(inputs) == {META}, "a CUDA model would be fed CPU ids"
    assert len(inputs) == 1 + intervals  # the context, then each timed forward
    assert len(waits) >= 2 * intervals and set(waits) == {META}


def test_bench_batch_ceiling_times_each_forward_between_done_stamps(own_tiny, monkeypatch, waits):
    from engine.bench import batch_ceiling

    monkeypatch.setattr(batch_ceiling, "load_model", lambda args: own_tiny)
    args, _ = parse("batch_ceiling", "--batch", "2", "--context", "4", "--prompt-tokens", "3",
                    "--cached-tokens", "2", "--rounds", "1")
    result = batch_ceiling.run(args, lambda *a: None)
    intervals = 2 * len(result["forward_ms"])  # the warm-up round is stamped too
    assert len(waits) >= 2 * intervals and set(waits) == {own_tiny.device}


def test_bench_dtypes_times_prefill_between_done_stamps(own_tiny, monkeypatch, waits):
    from engine.bench import dtypes

    monkeypatch.setattr(dtypes, "load_model", lambda args, dtype: own_tiny)
    args, _ = parse("dtypes", "--dtypes", "fp32", "--runs", "2", "--prefill-tokens", "8", "--max-new-tokens", "2")
    dtypes.run(args, lambda *a: None)
    assert len(waits) >= 2 * 2 + 2 * 2 and set(waits) == {own_tiny.device}  # 2 prefills, 2 replies of 2 tokens


def test_bench_prefill_chunks_stamps_start_chunks_and_end(own_tiny, waits):
    from engine.bench.prefill_chunks import time_prefill

    ms, _, first_ms, _ = time_prefill(own_tiny, list(range(100, 110)), 4)
    assert 0 < first_ms <= ms
    assert len(waits) >= 2 + 3 and set(waits) == {own_tiny.device}  # start and end, and each of 3 chunks


def test_bench_baseline_stamps_both_engines_tokens_once_done(tiny, monkeypatch, waits):
    from engine.bench import baseline

    monkeypatch.setattr(baseline, "load_model", lambda args: tiny)
    args, _ = parse("baseline", "--prompts", "1", "--runs", "1", "--max-new-tokens", "3")
    result = baseline.run(args, lambda *a: None)
    tokens = result["per_prompt"][0]["tokens"]
    assert len(waits) >= 2 * tokens and set(waits) == {tiny.device}  # ours and generate's streamer


def test_bench_quant_times_prefill_between_done_stamps(tiny, monkeypatch, waits):
    from engine.bench import quant

    monkeypatch.setattr(quant, "load_model", lambda args: tiny)
    args, _ = parse("quant", "--variants", "int8wo", "--no-memory", "--runs", "1", "--prompts", "1",
                    "--max-new-tokens", "2", "--prefill-tokens", "8", "--head-rows", "")
    result = quant.run(args, lambda *a: None)
    variants = len(result["variants"])
    assert variants >= 2 and len(waits) >= 2 * variants and set(waits) == {tiny.device}
    assert all(row["memory"] is None for row in result["variants"].values())  # --no-memory: unknown, not 0


def test_bench_quant_reads_gpu_memory_for_a_cuda_model_and_says_so(monkeypatch):
    """On CUDA the variant's memory is the allocator's, its peak reset before the build; on CPU the
    process's resident memory. The figures say which."""
    from engine.bench.quant import measure_build

    host = measure_build("cpu", lambda: None)
    assert host["memory"] == "host" and host["peak_bytes"] > 0

    allocated, events = [1000], []

    def build():
        events.append("build")
        allocated[0] += 500

    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: events.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: allocated[0])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: allocated[0] + 200)
    gpu = measure_build("cuda:0", build)
    assert gpu == {"memory": "gpu", "peak_bytes": 1700, "build_bytes": 500}
    assert events.index("reset") < events.index("build") < len(events) - 1  # reset first; a wait after the build


def test_bench_bandwidth_stamps_each_step_and_names_the_limits_device(tiny_model_dir, tmp_path, monkeypatch, waits):
    from engine.measure import machine_limits
    from engine.measure.machine_limits import MachineLimits

    monkeypatch.setenv("LATENCY_LAB_CACHE", str(tmp_path))
    machine_limits.save(tmp_path, MachineLimits(key=machine_limits.machine_key("cpu"), measured_at="2026-12-03T00:00:00Z",
                                                copy_gbps=8.0, read_gbps=10.0, matmul_tflops={"fp32": 0.05, "bf16": 0.1, "int8": 0.2}))
    monkeypatch.setattr(machine_limits, "measure", lambda *a, **kw: pytest.fail("the cached probe must serve"))
    args, bandwidth = parse("bandwidth", "--rounds", "2", "--steps", "2", "--context", "8", "--variants", "int8wo",
                            model_dir=tiny_model_dir)
    result = bandwidth.run(args, lambda *a: None)
    steps = len(result["variants"]) * 2 * 2
    assert len(result["variants"]) == 2 and len(waits) >= 2 * steps and set(waits) == {CPU}
    assert result["limits_device"] == "cpu" and result["read_gbps"] == 10.0
    paired = result["variants"]["int8wo"]["gbps_vs_default"]  # against the default, round by round
    assert paired["rounds"] == 2 and len(paired["per_round"]) == 2 and paired["ci95"] is None  # unknown under 3


def test_paired_ratio_compares_each_round_with_itself():
    """A machine that slows down between rounds slows both models of a round: the paired ratio keeps
    the models' own ratio (here a: 2x b's speed, bytes scaled by 0.5 -> 1.0x b's GB/s), and its
    interval (the one paired estimate, engine/measure/paired.py) spans the rounds' disagreement."""
    from engine.bench.quant_steps import paired_ratio
    from engine.measure import paired

    slow = [1.0, 3.0, 1.5, 2.5]  # each round's machine
    a = [s * 0.010 for s in slow for _ in range(3)]
    b = [s * 0.020 for s in slow for _ in range(3)]
    r = paired_ratio(a, b, rounds=4, steps=3, scale=0.5)
    assert r["per_round"] == [1.0] * 4 and r["ratio"] == 1.0 and r["ci95"] == [1.0, 1.0]  # rounds agree
    b[3] *= 1.2  # round 1's b steps 1.2x slower (its median moves): that round's ratio alone moves
    b[4] *= 1.2
    r = paired_ratio(a, b, rounds=4, steps=3, scale=0.5)
    assert r["per_round"] == [1.0, 1.2, 1.0, 1.0]
    # the order-adjusted geometric mean: the mean of round 0's and 2's log ratios (one order) and of
    # round 1's and 3's (the other) averaged, so 1.2 ** (1 / 4), not the median's 1.0
    assert r["ratio"] == round(1.2 ** 0.25, 3)
    e = paired.estimate([0.0, math.log(1.2), 0.0, 0.0], ["AB", "BA", "AB", "BA"])
    assert r["ci95"] == [round(math.exp(e.lo), 3), round(math.exp(e.hi), 3)]
    assert r["ci95"][0] < 1.0 < 1.2 < r["ci95"][1]  # four rounds, one off by 20%: nothing decided
    two = paired_ratio(a[:6], b[:6], rounds=2, steps=3, scale=0.5)
    assert two["ci95"] is None and two["ratio"] == round(1.2 ** 0.5, 3)  # under 3 rounds: the estimate alone


def test_bench_bandwidth_divides_a_cuda_models_steps_by_the_gpus_limits(tiny_model_dir, tmp_path, monkeypatch):
    """For a model on CUDA, bench bandwidth takes the CUDA probe's read bandwidth (HBM), never the
    host's that the same cache folder holds."""
    from engine.core.errors import LatencyLabError
    from engine.measure import machine_limits
    from engine.measure.machine_limits import MachineLimits

    monkeypatch.setenv("LATENCY_LAB_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    machine_limits.save(tmp_path, MachineLimits(key=machine_limits.machine_key("cpu"), measured_at="2026-12-03T00:00:00Z",
                                                copy_gbps=8.0, read_gbps=10.0, matmul_tflops={"fp32": 0.05, "bf16": 0.1, "int8": 0.2}))
    probed = []

    def measure(device, dtypes, *a, **kw):
        probed.append(torch.device(device))
        return MachineLimits(key=machine_limits.machine_key(device), measured_at="2026-12-03T00:00:00Z",
                             copy_gbps=3000.0, read_gbps=4000.0, matmul_tflops={d: 500.0 for d in dtypes})

    monkeypatch.setattr(machine_limits, "measure", measure)
    args, bandwidth = parse("bandwidth", model_dir=tiny_model_dir)
    limits = bandwidth.machine_limits_for(args, torch.device("cuda:0"), "bf16")
    assert probed == [torch.device("cuda:0")] and limits.read_gbps == 4000.0
    assert bandwidth.limits_device(limits) == "cuda (NVIDIA H200)"
    host = machine_limits.cached(tmp_path, "cpu")
    monkeypatch.setattr(machine_limits, "load_or_measure", lambda *a, **kw: host)  # a cache that mixed them up
    with pytest.raises(LatencyLabError, match="re-measure"):
        bandwidth.machine_limits_for(args, torch.device("cuda:0"), "bf16")


def test_bench_kv_and_lookup_time_through_replies_whose_stamps_follow_the_device(tiny, monkeypatch, waits):
    """kv, lookup (and draft, peer, which run the same `run_request`) read their times off the
    replies' Timelines, whose token stamps follow a wait (test above): each reply waited."""
    from engine.bench import kv, lookup

    monkeypatch.setattr(kv, "load_model", lambda args: tiny)
    monkeypatch.setattr(lookup, "load_model", lambda args: tiny)
    args, _ = parse("kv", "--max-new-tokens", "2", "--last-tokens", "2", "--runs", "1")
    result = kv.run(args, lambda *a: None)
    replies = len(result["turns"]) + 2
    assert len(waits) >= 2 * replies and set(waits) == {tiny.device}
    waits.clear()
    args, _ = parse("lookup", "--prompts", "1", "--runs", "1", "--max-new-tokens", "4", "--skip-open-ended")
    result = lookup.run(args, lambda *a: None)
    assert len(waits) >= 2 * 2 and set(waits) == {tiny.device}  # a reply with and one without speculation
