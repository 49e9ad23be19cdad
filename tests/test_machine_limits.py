"""The one limits probe (engine/measure/machine_limits.py): its aggregation against a busy moment, its
cache (round trip, date, version), its device dispatch; and that a reply's decode fraction in the API's
`timings`, on the page's row and in `python -m engine.bench bandwidth` divide by the same cached limit."""

import json

import pytest
import torch

from engine.measure import machine_limits, probes
from engine.measure.machine_limits import MachineLimits

FAKE = MachineLimits(key={}, measured_at="2026-12-03T10:00:00Z", copy_gbps=3.0, matmul_tflops={"fp32": 0.05},
                     read_gbps=4.0, details={"read": machine_limits.aggregate([4.0, 1.0, 3.5])})


def test_a_busy_round_does_not_set_the_limit_low_and_the_spread_says_it_was_busy():
    steady = machine_limits.aggregate([20.0, 19.8, 20.1, 19.9, 20.0])
    busy = machine_limits.aggregate([20.0, 6.0, 19.9, 7.5, 20.1])  # two rounds shared the CPU with a neighbour
    assert steady["best"] == busy["best"] == 20.1  # the limit: a busy moment only slows a round down
    assert busy["median"] < steady["median"] and busy["worst"] == 6.0
    assert steady["spread"] < 0.02 and busy["spread"] == pytest.approx((20.1 - 6.0) / 20.1, abs=1e-4)
    assert busy["rounds_n"] == 5 and busy["rounds"] == [20.0, 6.0, 19.9, 7.5, 20.1]
    empty = machine_limits.aggregate([None, 0.0])
    assert empty["best"] is None and empty["spread"] is None  # unknown, never 0


def test_the_cache_round_trips_with_its_date_and_ignores_an_older_version(tmp_path, monkeypatch):
    limits = MachineLimits(**{**FAKE.__dict__, "key": machine_limits.machine_key("cpu")})
    path = machine_limits.save(tmp_path, limits)
    assert path == machine_limits.cache_file(tmp_path, machine_limits.machine_key("cpu"))
    back = machine_limits.cached(tmp_path, "cpu")
    assert back.to_dict() == limits.to_dict() and back.date == "2026-12-03" and back.read_gbps == 4.0
    assert back.spread("read") == pytest.approx(0.75)
    measured = []
    monkeypatch.setattr(machine_limits, "measure", lambda *a, **kw: measured.append(a) or limits)
    assert machine_limits.load_or_measure(tmp_path, "cpu", ("fp32",)).read_gbps == 4.0 and not measured
    machine_limits.load_or_measure(tmp_path, "cpu", ("fp32", "fp16"))  # a dtype it lacks: measured again
    assert len(measured) == 1
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "version": 1}))  # a copy-only probe of an older version
    assert machine_limits.cached(tmp_path, "cpu") is None


def test_decode_fraction_divides_by_read_bandwidth_and_unknown_stays_none():
    assert FAKE.decode_fraction(2.0) == 0.5  # read 4.0, not copy 3.0
    assert FAKE.decode_fraction(None) is None
    assert MachineLimits(key={}, measured_at="x", copy_gbps=3.0).decode_fraction(2.0) is None
    assert "read 4.0 GB/s · copy 3.0 GB/s" in FAKE.summary() and "spread ≤ 75% over 3" in FAKE.summary()


def test_device_dispatch_sizes_and_dtypes(monkeypatch):
    """The CUDA path is what can be checked without a GPU: which buffer, how many calls per timed repeat,
    which dtypes; the probe itself synchronizes before every timestamp (the one clock's done-stamps)."""
    from engine.platform import capabilities
    from engine.core import clock

    monkeypatch.setattr(machine_limits, "llc_bytes", lambda: 32 * 2**20)
    assert machine_limits.buffer_mib("cpu") == 256
    monkeypatch.setattr(machine_limits, "llc_bytes", lambda: 96 * 2**20)  # a stacked-cache CPU: 8× its cache
    assert machine_limits.buffer_mib("cpu") == 768
    assert machine_limits.buffer_mib("cuda") == 1024
    assert probes._inner(torch.device("cuda")) == 10 and probes._inner(torch.device("cpu")) == 1
    with capabilities.forced(native_bf16=False, cuda_bf16=True):
        assert machine_limits.probe_dtypes("fp32", "cpu") == ("fp32", "int8")  # emulated bf16 is no roof
        assert machine_limits.probe_dtypes("fp32", "cuda") == ("fp32", "bf16")  # int8: the CPU's w8a roof
    with capabilities.forced(native_bf16=True):
        assert machine_limits.probe_dtypes("bf16", "cpu") == ("fp32", "bf16", "int8")
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(d))
    clock.sync(torch.device("cuda"))
    clock.sync(torch.device("cpu"))
    assert len(synced) == 1
    before = clock.syncs  # every repeat of a probe is timed between two done-stamps on the probed device
    _, reps = probes._best_of(lambda: None, torch.device("cpu"), budget_s=0.0)
    assert reps >= 2 and clock.syncs - before >= 2 * reps


def test_the_api_the_page_and_bench_bandwidth_divide_by_the_one_cached_limit(tiny, tiny_model_dir, tmp_path,
                                                                            monkeypatch):
    """One reply's decode: the API's timings and the page's row carry the engine's limit; `bench bandwidth`
    reads the same cached probe; all three fractions are decode GB/s / that read_gbps."""
    from engine.bench import build_parser
    from engine.core.config import GenerationConfig
    from engine.serving.service import Engine
    from server.protocol import timings_of
    from ui.chat import records

    monkeypatch.setenv("LATENCY_LAB_CACHE", str(tmp_path))
    limits = MachineLimits(**{**FAKE.__dict__, "key": machine_limits.machine_key("cpu"),
                              "matmul_tflops": {"fp32": 0.05, "bf16": 0.1, "int8": 0.2}})
    machine_limits.save(tmp_path, limits)
    monkeypatch.setattr(machine_limits, "measure", lambda *a, **kw: pytest.fail("the cached probe must serve"))
    from engine.lab import attach

    engine = attach(Engine(tiny), machine_limits.load_or_measure(tmp_path, "cpu", ("fp32",)))
    try:
        done = engine.complete(None, GenerationConfig(temperature=0.0, max_new_tokens=6),
                               prompt_ids=list(range(100, 110)))
    finally:
        engine.close()
    timings = timings_of(done.timeline)
    assert timings["roofline"]["read_gbps"] == limits.read_gbps
    assert timings["decode_bandwidth_fraction"] == pytest.approx(limits.decode_fraction(timings["decode_gbps"]))
    row = records.row({"timeline": done.timeline.to_dict(), "settings": {}})
    assert row["read_gbps"] == limits.read_gbps
    assert row["decode_bandwidth_fraction"] == timings["decode_bandwidth_fraction"]

    p, bandwidth = build_parser(["bandwidth", "--model", str(tiny_model_dir), "--dtype", "fp32", "--rounds", "1",
                                 "--steps", "1", "--variants", "int8wo"])
    result = bandwidth.run(p.parse_args(["bandwidth", "--model", str(tiny_model_dir), "--dtype", "fp32",
                                         "--rounds", "1", "--steps", "1", "--variants", "int8wo"]), lambda *a: None)
    assert result["read_gbps"] == limits.read_gbps and result["limits_date"] == limits.date
    for figures in result["variants"].values():
        assert figures["fraction_of_read"] == pytest.approx(limits.decode_fraction(figures["gbps"]), abs=2e-3)  # both rounded


def test_the_int8_peak_is_integer_products_and_says_so():
    """The w8a variants' roof: torch._int_mm of int8 matrices, counted in operations (TOP/s), beside fp32."""
    probe = probes.MatmulProbe(torch.device("cpu"), torch.int8, max_n=256)
    assert probe.a.dtype == torch.int8 and probe.mm(probe.a, probe.b).dtype == torch.int32
    assert "_int_mm" in probe.info["op"] and probe.round(0.01) > 0
    limits = MachineLimits(key={"test": True}, measured_at="2026-12-05T09:00:00Z", copy_gbps=7.0,
                           matmul_tflops={"fp32": 0.2, "int8": 0.8}, read_gbps=10.0)
    assert "fp32 matmul 0.2 TFLOP/s · int8 matmul 0.8 TOP/s" in limits.summary()
    assert machine_limits.exceeded(limits, tflops=0.5, dtype="int8") == []  # 0.5 of 0.8: no wrong limit
    assert machine_limits.exceeded(limits, tflops=0.5, dtype="fp32") == ["matmul_fp32"]


def test_a_cached_probe_missing_a_peak_gets_that_peak_alone(tmp_path, monkeypatch):
    """A dtype added since the cache was written (int8): only its peak is probed, the cached bandwidths and
    peaks are kept (a full re-probe at start, beside the engine warming up, once read half of them)."""
    old = MachineLimits(**{**FAKE.__dict__, "key": machine_limits.machine_key("cpu")})
    machine_limits.save(tmp_path, old)
    asked = []

    def fake_measure(device, dtypes, seconds=3.0, rounds=5, bandwidth=True):
        asked.append((tuple(dtypes), bandwidth))
        return MachineLimits(key=old.key, measured_at="2026-12-05T10:00:00Z", copy_gbps=None, read_gbps=None,
                             matmul_tflops={d: 0.7 for d in dtypes}, details={f"matmul_{d}": {"best": 0.7} for d in dtypes})

    monkeypatch.setattr(machine_limits, "measure", fake_measure)
    got = machine_limits.load_or_measure(tmp_path, "cpu", ("fp32", "int8"))
    assert asked == [(("int8",), False)]
    assert got.read_gbps == old.read_gbps and got.copy_gbps == old.copy_gbps and got.measured_at == old.measured_at
    assert got.matmul_tflops == {**old.matmul_tflops, "int8": 0.7} and "matmul_int8" in got.details
    assert machine_limits.load_or_measure(tmp_path, "cpu", ("fp32", "int8")).matmul_tflops["int8"] == 0.7  # saved
    assert asked == [(("int8",), False)]


def test_the_read_probe_takes_the_faster_of_its_readers_and_ours_reads_every_byte(monkeypatch):
    """torch.sum read below what an fp32 decode step streams on an Intel Xeon (docs/roofline.md), so the probe
    reads with our fp32 one-row product too where our kernels are built, and the limit is the faster."""
    from engine.kernels import cpu_gemm

    probe = probes.ReadProbe(torch.device("cpu"), mib=4)
    if cpu_gemm.built_reason() is None:
        out = probe.readers["fp32_mm(buf as panels)"]()
        # a buffer of ones as panels of 2,048 inputs: every output sums 2,048 ones, all outputs the whole buffer
        assert out.shape == (1, probe.buf.numel() // probe.K) and torch.all(out == probe.K)
    monkeypatch.setattr(cpu_gemm, "built_reason", lambda: "no C++ compiler found")
    assert list(probes.ReadProbe(torch.device("cpu"), mib=4).readers) == ["torch.sum(buf)"]  # torch's alone
    slow_then_fast = iter([2.0, 1.0, 1.0, 4.0])  # seconds a read: reader 1 then 2 in round 1, again in round 2
    monkeypatch.setattr(probes, "_best_of", lambda fn, *a, **k: (next(slow_then_fast), 2))
    probe.readers = {"a": None, "b": None}
    probe.best = {"a": 0.0, "b": 0.0}
    gb = probe.buf.numel() * 4 / 1e9
    assert probe.round(1.0) == pytest.approx(gb / 1.0)  # this round's faster reader: b
    assert probe.round(1.0) == pytest.approx(gb / 1.0)  # a, this time
    assert probe.best == {"a": round(gb, 2), "b": round(gb, 2)}  # each reader's best over the rounds
