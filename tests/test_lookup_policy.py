"""Prompt lookup's adaptive policy (engine/speculative/lookup_policy.py) and the measured cost
table (engine/speculative/costs.py), driven by synthetic token streams: no model, no clock."""

from __future__ import annotations

import random

import pytest

from engine.speculative.costs import CostModel, cost_model_from_times
from engine.speculative.lookup_policy import LookupPolicy

# A verify pass as dear as on the AVX2 Zen 3 in fp32 (plain steps per T = k + 1), and a cheap one.
DEAR = CostModel(0.74, 0.107, verify_steps=((2, 1.85), (3, 2.3), (5, 2.2), (9, 2.6)))
CHEAP = CostModel(0.05, 0.01, verify_steps=((2, 1.05), (3, 1.06), (5, 1.08), (9, 1.12)))


def drive(policy: LookupPolicy, text: list[int], propose, steps: int, n: int = 3, positions=None) -> list[int]:
    """Decode `text` with `policy`: propose(pos) gives the lookup's guess at pos; returns k per step
    (and appends to `positions` where each step started)."""
    pos, ks = 0, []
    while len(ks) < steps:
        if positions is not None:
            positions.append(pos)
        guess = propose(pos)
        key = policy.key_for(n)
        policy.track(guess, key)
        k = policy.choose(len(guess), room=1000, key=key)
        m = 0
        while m < k and guess[m] == text[pos + m]:
            m += 1
        emitted = text[pos : pos + (m + 1 if k else 1)]
        policy.advance(emitted)
        ks.append(k)
        pos += len(emitted)
    return ks


def random_text(seed: int, n: int = 2000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def test_it_speculates_inside_a_copy_at_full_k_and_backs_off_at_its_end():
    text, noise = random_text(0), random.Random(1)
    in_copy = lambda pos: 20 <= pos < 100  # noqa: E731 - positions where the lookup finds the real continuation

    def propose(pos):
        return text[pos : pos + 8] if in_copy(pos) else [noise.randrange(1000) for _ in range(8)]

    positions = []
    ks = drive(LookupPolicy(8, DEAR), text, propose, steps=60, positions=positions)
    before = [k for k, p in zip(ks, positions) if p < 20]
    inside = [k for k, p in zip(ks, positions) if 24 <= p < 92]
    after = [k for k, p in zip(ks, positions) if p >= 100]
    assert before and not any(before)  # wrong guesses are never verified
    assert inside and sum(k == 8 for k in inside) >= len(inside) - 1  # a copy is checked 8 at a time
    # one verify may fall on the copy's end (the policy learns it ended from that miss); none after
    assert after and not any(after[1:])


def test_open_text_with_occasional_right_first_guesses_is_never_verified_at_a_dear_cost():
    """First guesses right half the time, then wrong: at ~1.9 plain steps per verify, no k pays."""
    text, rng = random_text(2), random.Random(3)

    def propose(pos):
        first = text[pos] if rng.random() < 0.5 else rng.randrange(1000)
        return [first] + [rng.randrange(1000) for _ in range(7)]

    assert not any(drive(LookupPolicy(8, DEAR), text, propose, steps=200))
    # the same stream with a cheap verify: the first guess alone pays (1.5 tokens for 1.05 steps)
    rng.seed(3)
    cheap = drive(LookupPolicy(8, CHEAP), text, propose, steps=200)
    assert sum(k == 1 for k in cheap[-100:]) >= 70  # one guess, once positions 2+ are seen to fail


def test_the_survival_curve_is_kept_per_position():
    """Proposals right on their first token and wrong on the second: guess exactly one where
    verify(2) is cheap and verify(3+) dear."""
    costs = CostModel(0.0, 0.5, verify_steps=((2, 1.1), (3, 2.5), (5, 3.0), (9, 4.0)))
    text, rng = random_text(4), random.Random(5)
    ks = drive(LookupPolicy(8, costs), text, lambda pos: [text[pos]] + [rng.randrange(1000) for _ in range(7)],
               steps=60)
    assert ks[-20:] == [1] * 20


def test_fixed_k_guesses_every_proposal_up_to_the_room():
    policy = LookupPolicy(4, DEAR, adaptive=False)
    assert policy.choose(proposed=8, room=100, key=(1, False)) == 4
    assert policy.choose(proposed=2, room=100, key=(1, False)) == 2
    assert policy.choose(proposed=8, room=3, key=(1, False)) == 3


def test_the_cost_table_interpolates_and_extrapolates():
    assert DEAR.verify(1) == 1.0 and DEAR.verify(2) == 1.85
    assert DEAR.verify(4) == pytest.approx(2.25)  # halfway between T = 3 and T = 5
    assert DEAR.verify(11) == pytest.approx(2.6 + 0.1 * 2)  # the 5 -> 9 slope past the end
    line = CostModel(0.2, 0.03)  # nothing measured: the line
    assert line.verify(5) == pytest.approx(1.32) and line.to_dict()["verify_steps"] is None
    assert DEAR.to_dict()["verify_steps"][0] == [2, 1.85]


def test_calibration_pairs_each_round_so_a_slow_round_does_not_skew_the_ratios():
    """Round 2 ran while a neighbour loaded the machine (every forward 3x slower); round 3 only its
    T = 1 forward was unlucky. Paired medians keep the true ratios."""
    times = {1: [0.05, 0.15, 0.10, 0.05], 2: [0.09, 0.27, 0.09, 0.09], 9: [0.13, 0.39, 0.13, 0.13]}
    costs = cost_model_from_times(times)
    steps = dict(costs.verify_steps)
    assert steps[2] == pytest.approx(1.8) and steps[9] == pytest.approx(2.6)
    assert costs.verify_per_token == pytest.approx(0.8 / 7) and costs.verify_fixed == pytest.approx(0.8 - 0.8 / 7)
    assert costs.step_ms == pytest.approx(75.0)
