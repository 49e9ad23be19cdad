"""What-if (engine/measure/whatif.py): the pass model's arithmetic on a made-up reply, and the
longer prompt it builds for a check."""

from __future__ import annotations

import pytest

from engine.measure import whatif
from engine.serving.work import ModelShape, prefill_flops

SHAPE = ModelShape(layers=4, heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=256, vocab=1000)
REPLY = {"prefill_tokens": 50, "cached_tokens": 10, "prefill_ms": 140.0, "ttft_ms": 150.0, "tpot_ms": 40.0,
         "roofline": {"weight_bytes": 4e8, "read_gbps": 10.0, "peak_tflops": 0.5}}


def extra(n, c):
    return prefill_flops(SHAPE, n, c) - prefill_flops(SHAPE, 1, c + n - 1)


def test_the_fit_reads_a_pass_from_tpot_and_the_rate_from_the_prefill():
    f = whatif.fit(REPLY, SHAPE)
    assert f.t_read_ms == 40.0 and f.read_from == "this reply's TPOT"
    assert f.flops_per_ms == pytest.approx(extra(50, 10) / 100.0) and f.rate_from == "this reply's prefill"


def test_the_same_length_predicts_the_reply_itself_and_longer_costs_more_than_linearly():
    same = whatif.predict(REPLY, SHAPE)
    assert same.ttft_ms == pytest.approx(150.0) and same.tpot_ms == pytest.approx(40.0)
    four = whatif.predict(REPLY, SHAPE, prefill_tokens=200)
    rate = extra(50, 10) / 100.0
    assert four.prefill_ms == pytest.approx(40.0 + extra(200, 10) / rate)
    assert four.ttft_ms == pytest.approx(10.0 + four.prefill_ms)  # the stages around prefill as measured
    assert four.prefill_ms - 40.0 > 4 * (same.prefill_ms - 40.0)  # attention grows with the square


def test_half_the_weight_bytes_halves_tpot_and_a_batch_adds_rows_of_compute():
    half = whatif.predict(REPLY, SHAPE, weight_bytes=2e8)
    assert half.tpot_ms == pytest.approx(20.0) and half.prefill_ms == pytest.approx(140.0 - 20.0)
    eight = whatif.predict(REPLY, SHAPE, batch=8)
    f = whatif.fit(REPLY, SHAPE)
    assert eight.tpot_ms == pytest.approx(40.0 + 7 * 2 * SHAPE.layer_matmul_params / f.flops_per_ms)
    assert eight.ttft_ms == pytest.approx(150.0)


def test_without_a_tpot_or_a_visible_prefill_it_falls_back_on_the_machine_limits():
    short = {**REPLY, "tpot_ms": None, "prefill_ms": 41.0}  # one pass: 4e8 B / 10 GB/s = 40 ms
    f = whatif.fit(short, SHAPE)
    assert f.t_read_ms == pytest.approx(40.0) and f.read_from == "weight bytes / read bandwidth"
    assert f.flops_per_ms == pytest.approx(0.5e9) and f.rate_from == "the machine's matmul peak"
    assert whatif.fit({**REPLY, "prefill_ms": None}, SHAPE) is None


def test_a_longer_prompt_is_about_the_factor_longer(tokenizer):
    msgs = [{"role": "user", "content": "Explain how a hash table handles collisions."}]
    longer, base, n = whatif.longer_messages(tokenizer, msgs, 4)
    assert abs(n / base - 4) < 0.5 and longer[-1]["content"].startswith(msgs[0]["content"])
