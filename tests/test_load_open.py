"""Open-loop load without a model: the arrival process (seeded), goodput against hand-computed cases,
the knee on synthetic levels, the sweep's stop rules, the Pareto sentence, and the result's field
names (vLLM's `bench serve` names where they mean the same). Against a served model:
tests/test_load_sweep.py."""

import math

import numpy as np
import pytest

from server.load import pareto
from server.load.arrivals import Arrivals, arrival_times, gaps
from server.load.pool import Result
from server.load.serve_figures import (
    knee,
    level_summary,
    meets,
    parse_goodput,
    request_metrics,
    saturated,
)


# --- arrivals ------------------------------------------------------------------------------------
def test_poisson_arrivals_have_the_asked_mean_rate_and_are_seeded():
    g = gaps(20_000, rate=4.0, seed=7)
    assert g.mean() == pytest.approx(0.25, rel=0.03)
    assert np.std(g) / np.mean(g) == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    assert np.array_equal(g, gaps(20_000, rate=4.0, seed=7))
    assert not np.array_equal(g, gaps(20_000, rate=4.0, seed=8))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_keep_the_rate_and_take_the_burstiness_as_shape(burstiness):
    """vLLM: gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate, CV^2 = 1/shape."""
    g = gaps(40_000, rate=2.0, burstiness=burstiness, seed=1)
    assert g.mean() == pytest.approx(0.5, rel=0.03)
    shape = g.mean() ** 2 / g.var()  # method of moments
    assert shape == pytest.approx(burstiness, rel=0.06)


def test_the_probe_goes_between_the_middle_two_arrivals():
    from server.load.open_loop import probe_time

    assert probe_time([1.0, 2.0, 4.0, 8.0]) == 3.0
    assert probe_time([0.5]) == 0.5 and probe_time([]) == 0.0


def test_constant_arrivals_are_evenly_spaced():
    t = arrival_times(Arrivals(rate=5.0, process="constant", num_prompts=6))
    assert t == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.2])


def test_a_duration_cuts_the_schedule_and_inf_sends_everything_at_once():
    t = arrival_times(Arrivals(rate=10.0, duration=3.0, seed=3))
    assert t and max(t) <= 3.0 and 15 <= len(t) <= 45  # ~30 expected
    assert arrival_times(Arrivals(rate=math.inf, num_prompts=4)) == [0.0] * 4
    with pytest.raises(ValueError):
        Arrivals(rate=0.0, num_prompts=3)
    with pytest.raises(ValueError):
        Arrivals(rate=1.0)  # neither a number of requests nor a duration


# --- goodput -------------------------------------------------------------------------------------
def _r(ttft, e2e, tokens, outcome="exact", queue=None, itl=None):
    return Result("k", 0, outcome=outcome, client_ttft_ms=ttft, client_e2e_ms=e2e, output_tokens=tokens,
                  client_itl_ms=itl or [], timings={"queue_ms": queue} if queue is not None else None)


def test_goodput_objectives_parse_as_vllm_writes_them():
    assert parse_goodput(["ttft:2000", "tpot:150"]) == {"ttft": 2000.0, "tpot": 150.0}
    assert parse_goodput("e2el:5000") == {"e2el": 5000.0}
    for bad in (["ttft"], ["itl:10"], ["tpot:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_tpot_is_the_decode_time_per_token_after_the_first():
    m = request_metrics(_r(100.0, 1000.0, 10))
    assert m["tpot"] == pytest.approx(100.0)  # (1000 - 100) / 9
    assert request_metrics(_r(100.0, 120.0, 1))["tpot"] is None


def test_goodput_counts_requests_meeting_every_objective_per_second():
    # by hand: A meets both; B's TTFT is too slow; C's TPOT (1900/19 = 100) too slow; D one token (no TPOT: meets);
    # E lost (not completed); over 2 s: 2 good / 2 s = 1.0 req/s
    results = [_r(500, 1100, 10), _r(2500, 3000, 10), _r(100, 2000, 20), _r(300, 300, 1), _r(None, None, None, "lost")]
    row = level_summary(results, 2.0, request_rate=2.0, burstiness=1.0, objectives={"ttft": 1000, "tpot": 80})
    assert row["good_requests"] == 2 and row["request_goodput"] == pytest.approx(1.0)
    assert row["completed"] == 4 and row["request_throughput"] == pytest.approx(2.0)
    assert row["lost"] == 1
    assert meets({"ttft": 1000, "tpot": 80.0, "e2el": 9}, {"ttft": 1000, "tpot": 80})  # <= holds at equality
    assert not meets({"ttft": None, "tpot": None, "e2el": None}, {"ttft": 1000})  # unknown TTFT fails
    row = level_summary(results, 2.0, request_rate=2.0, burstiness=1.0, objectives={"e2el": 1500})
    assert row["good_requests"] == 2  # A (1100) and D (300)
    assert level_summary(results, 2.0, request_rate=2.0, burstiness=1.0, objectives={})["request_goodput"] is None


def test_a_level_names_its_figures_as_vllm_does():
    results = [_r(100, 1000, 10, queue=5.0, itl=[90.0, 110.0]), _r(200, 2000, 10, queue=15.0, itl=[200.0])]
    row = level_summary(results, 4.0, request_rate=1.0, burstiness=1.0, objectives={"ttft": 2000})
    for name in ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                 "request_goodput", "output_throughput", "total_token_throughput", "request_rate", "burstiness",
                 "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
                 "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "p90_ttft_ms"):
        assert name in row, name
    assert row["mean_ttft_ms"] == pytest.approx(150.0) and row["median_e2el_ms"] == pytest.approx(1500.0)
    assert row["mean_itl_ms"] == pytest.approx(400 / 3, abs=0.01)  # every gap of every request
    assert row["output_throughput"] == pytest.approx(5.0) and row["p50_queue_ms"] == pytest.approx(10.0)
    only = level_summary(results, 4.0, request_rate=1.0, burstiness=1.0, objectives={}, percentile_metrics=("ttft",),
                         percentiles=(99,))
    assert "mean_tpot_ms" not in only and "p99_ttft_ms" in only and only["p90_ttft_ms"] is not None


# --- the knee and the stop rule ------------------------------------------------------------------
def test_the_knee_is_the_lowest_rate_within_5_percent_of_the_best_goodput():
    levels = [{"request_goodput": g} for g in (0.5, 0.9, 1.4, 1.45, 1.2, 0.4)]
    assert knee(levels) == 2  # 1.4 >= 0.95 * 1.45
    assert knee([{"request_goodput": g} for g in (0.5, 1.0, 2.0)]) == 2  # still rising: the last
    assert knee([{"request_goodput": 0.0}, {"request_goodput": None}]) is None  # nothing met the objectives
    assert knee([]) is None


def test_a_level_is_saturated_past_ten_times_the_ttft_objective():
    assert not saturated({"p90_ttft_ms": 19_999}, 2000)
    assert saturated({"p90_ttft_ms": 20_001}, 2000)
    assert saturated({"p90_ttft_ms": None}, 2000)  # nothing completed


def test_the_sweep_rises_until_a_stop_rule(monkeypatch):
    from server.load import sweep as sweep_mod

    goods = iter([1.0, 2.0, 2.5, 1.0, 3.0])  # falls below half the best at the 4th level

    def fake_drive(url, turns, times, deadline, *a, **kw):
        return [_r(100, 500, 4)], 1.0

    def fake_summary(level, wall, **kw):
        return {"request_rate": kw["request_rate"], "request_goodput": next(goods), "p90_ttft_ms": 100.0,
                "max_batch": None, "completed": 1, "num_prompts": 1, "duration": 1.0, "request_throughput": 1.0,
                "output_throughput": 4.0, **dict.fromkeys(("exact", "differs", "cancelled", "429", "4xx", "lost",
                                                           "crossed", "mismatched", "stuck", "5xx"), 0)}

    monkeypatch.setattr(sweep_mod, "drive_open_elsewhere", fake_drive)
    monkeypatch.setattr(sweep_mod, "level_summary", fake_summary)
    s = sweep_mod.SweepSettings(start_rate=1.0, factor=2.0, max_levels=8, num_prompts=2)
    out = sweep_mod.Sweep(s, "http://x", [], out=lambda line: None).run()
    assert [r["request_rate"] for r in out["levels"]] == [1.0, 2.0, 4.0, 8.0]
    assert out["knee_index"] == 2 and out["knee_request_rate"] == 4.0 and out["max_request_goodput"] == 2.5
    assert "past the knee" in out["stopped_because"] and out["knee_reached"] and out["ok"]
    capped = sweep_mod.Sweep(sweep_mod.SweepSettings(start_rate=1.0, factor=2.0, max_levels=2, num_prompts=2),
                             "http://x", [], out=lambda line: None)
    goods = iter([1.0, 2.0])
    result = capped.run()
    assert len(result["levels"]) == 2 and "cap" in capped.stopped_because
    assert not result["knee_reached"] and result["knee_request_rate"] == 2.0  # still rising: a lower bound


# --- the Pareto view -----------------------------------------------------------------------------
def test_the_pareto_frontier_and_sentence_state_the_measured_trade_off():
    pts = [{"output_throughput": 10, "output_throughput_per_user": 9}, {"output_throughput": 20,
           "output_throughput_per_user": 5}, {"output_throughput": 15, "output_throughput_per_user": 4}]
    assert [p["output_throughput"] for p in pareto.frontier(pts)] == [10, 20]  # 15 @ 4 is beaten by 20 @ 5

    def sweep(levels, best):
        return {"levels": [{"request_rate": r, "output_throughput": t, "output_throughput_per_user": u,
                            "request_goodput": g} for r, t, u, g in levels], "max_request_goodput": best}

    text = pareto.sentence({1: sweep([(0.5, 8.0, 10.0, 0.5), (1.0, 9.0, 9.0, 0.5)], 0.5),
                            8: sweep([(0.5, 8.0, 8.0, 0.5), (2.0, 27.0, 6.0, 1.6)], 1.6)})
    assert text.startswith("Max batch 8 reached 27.0 output tok/s in total at 6.0 tok/s per user, against 9.0")
    assert "3.0× the total for 0.67× the speed each user reads" in text and "1.60 req/s against 0.50 (3.2×)" in text


def test_the_default_tpot_objective_is_the_pages_reading_pace():
    from server.load.serve_figures import DEFAULT_OBJECTIVES
    from ui.chat.records import READING_PACE_TPS

    assert DEFAULT_OBJECTIVES["tpot"] == round(1000 / READING_PACE_TPS)


def test_the_bench_refuses_a_rate_it_cannot_send(capsys):
    from server.bench import main

    assert main(["load", "--request-rate", "0"]) != 0
    assert "--request-rate takes" in capsys.readouterr().err
    assert main(["load", "--request-rate", "sweep", "--goodput", "itl:5"]) != 0
    assert "goodput objectives are NAME:MS" in capsys.readouterr().err
