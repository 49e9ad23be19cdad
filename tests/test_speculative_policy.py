"""Speculative decoding's policy pieces: prompt lookup's proposals, greedy verification and adaptive k
(no model). (tests/test_speculative.py: exactness, caches, back-off on a model,
cancellation.)"""

from __future__ import annotations


import torch

from engine.speculative import (
    AdaptiveK,
    PromptLookup,
    verify_greedy,
)

# --- proposers, verification and the adaptive policy (no model) ------------------------------------
def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup(max_ngram=3, min_ngram=1)
    ids = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 3, 4, 9, 5, 6, 7]
    assert lookup.propose(ids, 3, None)[0] == [3, 4, 9]  # latest earlier "5 6 7" is followed by 3 4 9
    assert lookup.propose(ids + [3], 2, None)[0] == [4, 9]  # "6 7 3" now matches
    # (one PromptLookup follows one growing sequence; new sequences get a new one)
    assert PromptLookup().propose([1, 2, 3], 4, None)[0] == []  # nothing repeats
    assert PromptLookup().propose([1, 2, 1], 4, None)[0] == [2, 1]  # continuation cut at the sequence end


def test_verify_greedy_accepts_the_longest_agreeing_prefix_plus_one():
    logits = torch.full((4, 10), -1.0)
    for row, tok in enumerate([3, 4, 5, 6]):
        logits[row, tok] = 1.0
    assert verify_greedy([3, 4, 5], logits) == [3, 4, 5, 6]  # all accepted, plus the bonus
    assert verify_greedy([3, 9, 5], logits) == [3, 4]  # rejected at the second: target's token instead
    assert verify_greedy([0, 4, 5], logits) == [3]


def test_adaptive_k_backs_off_when_guesses_fail_and_keeps_k_when_they_pay():
    bad = AdaptiveK(max_k=4)
    ks = []
    for _ in range(12):
        k = bad.choose(room=100, free_probe=True)
        ks.append(k)
        if k:
            bad.observe(k, 0)
    assert ks[0] > 0 and ks[-1] == 0 and bad.acceptance < 0.2
    good = AdaptiveK(max_k=4)
    for _ in range(12):
        good.observe(good.choose(room=100, free_probe=True), good.k)
    assert good.choose(room=100, free_probe=True) == 4
    assert good.choose(room=2, free_probe=True) == 2  # never guesses past max_new_tokens


def test_adaptive_k_tracks_each_match_length_apart():
    """Prompt lookup's 1-token matches can fail while its 3-token matches pay: guess on the latter only."""
    policy = AdaptiveK(max_k=8)
    for _ in range(10):
        policy.observe(4, 0, key=1)
        policy.observe(4, 4, key=3)
    assert policy.choose(room=100, free_probe=True, key=1) == 0
    assert policy.choose(room=100, free_probe=True, key=3) >= 4
    assert policy.acceptance_for(1) < 0.1 < 0.9 < policy.acceptance_for(3)


def test_a_costlier_draft_guesses_fewer_tokens_and_a_draft_at_zero_is_probed():
    cheap, dear = AdaptiveK(max_k=8, draft_cost=0.05), AdaptiveK(max_k=8, draft_cost=0.5)
    for policy in (cheap, dear):
        for _ in range(10):
            policy.observe(4, 1)  # half the guesses examined accepted
    assert cheap.choose(room=100, free_probe=False) > dear.choose(room=100, free_probe=False) == 0
    probes = [dear.choose(room=100, free_probe=False) for _ in range(8 + 16 + 32)]
    # k = 1 after 8 plain steps (one was taken above), then, the probes not paying, after 16, then 32
    assert [i for i, k in enumerate(probes) if k] == [6, 22, 54]
