"""The roofline stays honest: a step above a measured limit means the limit is stale (probed while the machine
was busy). Injected stale limits: the note instead of a share above 100%, the re-probe (the engine's at its
next idle moment, the bench's at once), and the cache-resident model that may legitimately read faster."""

import time

import pytest

from engine.core.config import GenerationConfig
from engine.measure import machine_limits
from engine.measure.machine_limits import MachineLimits

STALE = MachineLimits(key={}, measured_at="2026-12-01T09:00:00Z", copy_gbps=0.5, matmul_tflops={"fp32": 1e3},
                      read_gbps=1e-3)  # far below anything a real step streams: a probe taken on a busy machine
FRESH = MachineLimits(key={}, measured_at="2026-12-05T09:00:00Z", copy_gbps=30.0, matmul_tflops={"fp32": 5.0},
                      read_gbps=1e4)


@pytest.fixture
def nothing_fits_in_cache(monkeypatch):
    monkeypatch.setattr(machine_limits, "llc_bytes", lambda: 1)  # every step reads from memory


def fresh_probe(monkeypatch, limits, calls):
    def measure(device="cpu", dtypes=("fp32",), seconds=3.0, rounds=5):
        calls.append(dtypes)
        return MachineLimits(**{**limits.__dict__, "key": machine_limits.machine_key(device)})

    monkeypatch.setattr(machine_limits, "measure", measure)


def test_a_share_above_the_limit_is_a_note_not_a_number(nothing_fits_in_cache):
    assert machine_limits.fraction_text(0.654) == "65%" and machine_limits.fraction_text(None) == "—"
    assert machine_limits.fraction_text(1.1) == "above the measured limit: limit stale"
    assert machine_limits.exceeded(STALE, gbps=5.0) == ["read"]
    low_peak = MachineLimits(**{**FRESH.__dict__, "matmul_tflops": {"fp32": 1e-6}})
    assert machine_limits.exceeded(low_peak, tflops=0.1, dtype="fp32") == ["matmul_fp32"]
    assert machine_limits.exceeded(FRESH, gbps=5.0, tflops=0.1, dtype="fp32") == []
    note = machine_limits.stale_note(STALE, ["read"])
    assert note.startswith("above the measured limit: limit stale") and "2026-12-01" in note


def test_a_step_that_fits_in_the_cache_is_no_sign_of_a_stale_limit(monkeypatch):
    monkeypatch.setattr(machine_limits, "llc_bytes", lambda: 32 * 2**20)
    assert machine_limits.exceeded(STALE, gbps=5.0, step_bytes=12e6) == []  # its bytes came from the cache
    assert machine_limits.exceeded(STALE, gbps=5.0, step_bytes=600e6) == ["read"]
    assert machine_limits.fraction_text(1.3, 12e6) == machine_limits.CACHE_NOTE


def test_the_bench_path_re_probes_a_stale_limit_and_says_so(tmp_path, monkeypatch, nothing_fits_in_cache):
    calls = []
    fresh_probe(monkeypatch, FRESH, calls)
    same, note = machine_limits.remeasure_if_exceeded(tmp_path, FRESH, gbps=5.0)
    assert same is FRESH and note is None and not calls  # within the limit: nothing to re-probe
    limits, note = machine_limits.remeasure_if_exceeded(tmp_path, STALE, gbps=5.0)
    assert calls and limits.read_gbps == FRESH.read_gbps
    assert note == "limit re-measured: read 0.0 GB/s was stale, read 10,000.0 GB/s now"
    assert machine_limits.cached(tmp_path).read_gbps == FRESH.read_gbps  # cached for the page and the next bench
    fresh_probe(monkeypatch, STALE, calls)  # the machine is still busy: the fresh probe is low again
    limits, note = machine_limits.remeasure_if_exceeded(tmp_path, STALE, gbps=5.0)
    assert note.startswith("above the measured limit even after re-measuring") and "limit stale" in note


def test_a_reply_above_the_limit_is_noted_and_the_engine_re_probes_when_idle(tiny, tmp_path, monkeypatch,
                                                                             nothing_fits_in_cache):
    from engine.lab import attach
    from engine.serving.service import Engine

    calls = []
    fresh_probe(monkeypatch, FRESH, calls)
    engine = attach(Engine(tiny), MachineLimits(**{**STALE.__dict__, "key": machine_limits.machine_key("cpu")}),
                    tmp_path)
    config = GenerationConfig(temperature=0.0, max_new_tokens=6)
    try:
        first = engine.complete(None, config, prompt_ids=list(range(100, 110))).timeline
        assert first.decode_bandwidth_fraction > 1  # what a stale limit gives
        assert first.limits_note.startswith("above the measured limit: limit stale")
        assert first.to_dict()["roofline"]["limits_note"] == first.limits_note  # what the page reads
        deadline = time.monotonic() + 120
        while engine.machine_limits.read_gbps != FRESH.read_gbps:  # the worker's idle work re-probes
            assert time.monotonic() < deadline, "the stale limit was never re-measured"
            time.sleep(0.05)
        assert calls
        later = engine.complete(None, config, prompt_ids=list(range(200, 210))).timeline
    finally:
        engine.close()
    assert later.read_gbps == FRESH.read_gbps and later.decode_bandwidth_fraction < 1
    assert later.limits_note == "limit re-measured: read 0.0 GB/s was stale, read 10,000.0 GB/s now"


def test_the_page_shows_the_note_not_the_share(nothing_fits_in_cache):
    from ui.chat import record_view

    r = {"decode_bandwidth_fraction": 1.1, "decode_gbps": 30.0, "limits_note": "above the measured limit: limit stale"}
    html = record_view._known("decode_bandwidth_fraction", r, "decode 110% of bandwidth")
    assert "110%" not in html and "decode above the measured limit: limit stale" in html


def test_a_re_probe_that_stays_below_is_said_once_and_not_repeated_after_every_reply(tiny, tmp_path, monkeypatch,
                                                                                    nothing_fits_in_cache):
    """Where the fresh probe still reads below the replies (a reader slower than the step's, a machine busy for
    long), re-probing after every reply would take both cores for seconds each time: one re-probe, then the
    finding on every later reply; the page's button still probes again."""
    from engine.lab import attach
    from engine.serving.service import Engine

    calls = []
    fresh_probe(monkeypatch, STALE, calls)  # every probe reads as low as the first
    engine = attach(Engine(tiny), MachineLimits(**{**STALE.__dict__, "key": machine_limits.machine_key("cpu")}),
                    tmp_path)
    config = GenerationConfig(temperature=0.0, max_new_tokens=6)
    try:
        engine.complete(None, config, prompt_ids=list(range(100, 110)))
        deadline = time.monotonic() + 120
        while not calls:  # the worker's idle work re-probes once
            assert time.monotonic() < deadline, "the limit was never re-measured"
            time.sleep(0.05)
        while engine.limits.note is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        later = engine.complete(None, config, prompt_ids=list(range(200, 210))).timeline
        assert engine.limits.pending is None  # nothing left to re-probe by itself
        assert later.limits_note.startswith("above the measured limit even after re-measuring")
        engine.remeasure_limits(seconds=0.1)  # the button: probes again, and a reply above it is re-probed again
        assert len(calls) == 2
        engine.complete(None, config, prompt_ids=list(range(300, 310)))
        while len(calls) < 3:
            assert time.monotonic() < deadline, "a reply above the button's probe was not re-probed"
            time.sleep(0.05)
    finally:
        engine.close()
