"""Speculation replayed: each verify's drafted ids and accepted count on the Timeline
(engine/speculative/replay.py), consistent with the reply the target produced, and the speedup the
measured costs predict."""

from __future__ import annotations

import pytest
from support import ask

from engine.core.config import GenerationConfig
from engine.core.request import Request
from engine.core.timeline import Timeline
from engine.serving.generate import generate
from engine.speculative import CostModel
from engine.speculative.replay import MAX_STEPS_KEPT, DraftLog, DraftStep, acceptance_by_position
from engine.bench import runner_for

COPY = ("Repeat this text exactly: The quick brown fox jumps over the lazy dog. "
        "The dog sleeps in the sun all afternoon.")


def test_the_log_prices_each_step_with_the_cost_model():
    log = DraftLog(CostModel(0.2, 0.05, measured=False))
    log.plain()
    log.verified(1, [5, 6, 7, 8], 2)  # 3 tokens for 1 + 0.2 + 4 * 0.05 = 1.4 steps
    assert log.tokens == 4 and log.cost == pytest.approx(2.4)
    assert log.predicted_speedup == pytest.approx(4 / 2.4)
    listed = [s.to_list() for s in log.steps]  # as the Timeline keeps them (counters.speculation.draft_steps)
    assert listed == [[1, 2, [5, 6, 7, 8]]] and log.count == 1 and log.costs.step_ms is None
    assert DraftStep.from_list(listed[0]) == DraftStep(1, (5, 6, 7, 8), 2)
    bad = DraftLog(CostModel(0.5, 0.1, measured=False))
    bad.verified(0, [1, 2, 3, 4], 0)  # nothing accepted: one token for 1.9 steps
    assert bad.predicted_speedup < 1


def test_the_log_keeps_a_bounded_number_of_steps_but_counts_them_all():
    log = DraftLog(CostModel(0.2, 0.03, measured=False))
    for i in range(MAX_STEPS_KEPT + 5):
        log.verified(i, [1], 1)
    assert len(log.steps) == MAX_STEPS_KEPT and log.count == MAX_STEPS_KEPT + 5


def test_acceptance_by_position():
    steps = [DraftStep(0, (1, 2, 3), 3), DraftStep(4, (1, 2, 3), 1), DraftStep(6, (1,), 0)]
    assert acceptance_by_position(steps) == [pytest.approx(2 / 3), 0.5, 0.5]
    assert acceptance_by_position([]) == []


def test_a_copy_prompt_records_every_verify_consistently_with_the_reply(bundled):
    tl = Timeline()
    tl.enqueued_ns = tl.started_ns = tl.received_ns
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=32, speculative="prompt_lookup", num_speculative_tokens=6)
    done = list(generate(runner_for(bundled), bundled.tokenizer, bundled.eos_token_ids,
                         Request(messages=ask(COPY), config=cfg), tl))[-1]
    c = done.timeline.to_dict()
    steps = [DraftStep.from_list(s) for s in c["draft_steps"]]
    out = done.token_ids
    assert steps and c["draft_step_count"] == len(steps)
    assert sum(s.accepted for s in steps) == c["accepted"] and sum(len(s.drafted) for s in steps) == c["drafted"]
    for s in steps:
        kept = out[s.at : s.at + s.accepted]
        assert list(s.drafted[: len(kept)]) == kept  # the accepted drafts are the reply's tokens there
        if s.accepted < len(s.drafted) and s.at + s.accepted < len(out):
            assert out[s.at + s.accepted] != s.drafted[s.accepted]  # greedy: the target chose otherwise
    assert any(s.accepted < len(s.drafted) for s in steps) or c["acceptance_rate"] == 1.0
    assert c["predicted_speedup"] > 0 and c["plain_step_ms"] > 0  # priced by measured costs
