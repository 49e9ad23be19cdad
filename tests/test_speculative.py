"""Speculative decoding: exactness (greedy equals plain greedy; sampling keeps the target's
distribution), cache rollback, adaptive back-off, cancellation, and clear errors."""

from __future__ import annotations

import copy
import json
import time

import pytest
import torch
from support import ask

from engine.core.config import GenerationConfig
from engine.core.errors import InvalidRequest, LoadError
from engine.core.request import Request
from engine.core.timeline import Timeline
from engine.serving.decoding import Decoding
from engine.serving.generate import build_prompt_ids, generate
from engine.serving.prefix_cache import PrefixCache
from engine.serving.sampling import Sampler
from engine.speculative import (
    AdaptiveK,
    CostModel,
    measured_costs,
    measured_draft_cost,
    verify_sampling,
)
from engine.speculative.draft import load_draft
from engine.bench import runner_for

# Varied prompts: copy-heavy ones (where prompt lookup finds matches) and open-ended ones.
TEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all afternoon."
CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
PROMPTS = [
    f"Repeat this text exactly: {TEXT}",
    f"Fix the grammar and return the text: me and him goes to the store and buyed apples. {TEXT}",
    f"Add a docstring to each function and return the code:\n{CODE}",
    f"Rename the function add to plus in this code:\n{CODE}",
    f"Summarize, quoting one sentence: {TEXT}",
    "Translate into French: The cat sleeps on the sofa.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List three fruits that are red.",
    "How do I reverse a list in Python?",
    "Give me two tips for sleeping better.",
    "Why is the sky blue?",
    "Write one sentence about a dragon.",
    "What is 12 times 12?",
    "Name three planets.",
    "Describe a rainbow in one sentence.",
    "What does HTTP stand for?",
    "Write a Python function that returns the square of a number.",
    "Count from one to ten in words.",
    "Say hello in Spanish, French and German.",
    f"Copy this line twice: {TEXT[:44]}",
]
N_TOKENS = 16
KS = (1, 2, 4, 8)


def run(lm, messages, factory=None, prefix_cache=None, session=None, **cfg):
    tl = Timeline()
    tl.enqueued_ns = tl.started_ns = tl.received_ns
    events = list(generate(runner_for(lm), lm.tokenizer, lm.eos_token_ids,
                           Request(messages=messages, config=GenerationConfig(**cfg), session=session), tl,
                           decoding_factory=factory, prefix_cache=prefix_cache, draft=lm.draft))
    return events[-1]


@pytest.fixture(scope="module")
def plain_greedy(bundled):
    return {p: run(bundled, ask(p), temperature=0.0, max_new_tokens=N_TOKENS).token_ids for p in PROMPTS}


# --- greedy exactness on the bundled model (fp32) ------------------------------------------------
@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
def test_greedy_speculation_equals_plain_greedy(bundled, plain_greedy, mode):
    assert bundled.draft is not None, "the bundled draft (assets/) did not load"
    drafted = accepted = 0
    for i, prompt in enumerate(PROMPTS):
        # adaptive off: every step speculates, so every step's verification is exercised
        done = run(bundled, ask(prompt), temperature=0.0, max_new_tokens=N_TOKENS, speculative=mode,
                   num_speculative_tokens=KS[i % len(KS)], speculative_adaptive=False)
        assert done.token_ids == plain_greedy[prompt], f"{mode}, k={KS[i % len(KS)]}: {prompt!r}"
        c = done.timeline.counters
        drafted, accepted = drafted + c.speculation.drafted, accepted + c.speculation.accepted
    assert drafted > 0 and 0 < accepted < drafted  # guesses were made, some accepted, some rejected


def test_adaptive_prompt_lookup_equals_plain_greedy_and_verifies_only_where_it_pays(bundled, plain_greedy):
    """The adaptive policy decides when to verify (engine/speculative/lookup_policy.py); whatever it
    decides, the reply is the plain greedy one, and on a copy it does verify."""
    verified = 0
    for prompt in PROMPTS[:6]:
        done = run(bundled, ask(prompt), temperature=0.0, max_new_tokens=N_TOKENS, speculative="prompt_lookup",
                   num_speculative_tokens=8)
        assert done.token_ids == plain_greedy[prompt], prompt
        c = done.timeline.counters
        assert c.speculation.cost_model["measured"] and c.speculation.cost_model["verify_steps"]
        verified += c.speculation.drafted > 0
    assert verified >= 1


def test_seeded_sampling_with_adaptive_prompt_lookup_is_reproducible(bundled):
    cfg = dict(temperature=0.7, top_p=0.95, max_new_tokens=24, speculative="prompt_lookup",
               num_speculative_tokens=8, seed=7)
    a = run(bundled, ask(PROMPTS[0]), **cfg)
    b = run(bundled, ask(PROMPTS[0]), **cfg)
    assert a.token_ids == b.token_ids and len(a.token_ids) >= 8  # (the reply may end before 24)
    assert a.timeline.counters.speculation.k_changes == b.timeline.counters.speculation.k_changes


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
def test_greedy_speculation_with_a_reused_prefix_cache(bundled, plain_greedy, mode):
    """KV reuse (#3) hands the speculative decoding a cache that already holds the conversation so
    far: turn 2 of a chat reuses turn 1's prompt and reply, and still decodes exactly."""
    cache = PrefixCache()
    for i, prompt in enumerate(PROMPTS[::3]):
        session = f"spec-{mode}-{i}"
        first = run(bundled, ask(prompt), prefix_cache=cache, session=session, temperature=0.0,
                    max_new_tokens=N_TOKENS, speculative=mode, num_speculative_tokens=KS[i % len(KS)],
                    speculative_adaptive=False)
        assert first.token_ids == plain_greedy[prompt]
        turn2 = [*ask(prompt), {"role": "assistant", "content": first.text}, *ask("Now say it again, shorter.")]
        plain = run(bundled, turn2, temperature=0.0, max_new_tokens=N_TOKENS)
        reused = run(bundled, turn2, prefix_cache=cache, session=session, temperature=0.0, max_new_tokens=N_TOKENS,
                     speculative=mode, num_speculative_tokens=KS[i % len(KS)], speculative_adaptive=False)
        assert reused.timeline.cached_tokens > 0 and plain.timeline.cached_tokens == 0
        assert reused.token_ids == plain.token_ids, f"{mode}: {prompt!r}"


def test_caches_match_a_fresh_prefill_after_rejections(bundled):
    """After each step the target cache holds exactly the committed tokens but the last, and the
    draft cache a prefix of them, with the same keys and values a fresh prefill computes."""
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=24, speculative="draft", num_speculative_tokens=4,
                           speculative_adaptive=False)
    prompt_ids = build_prompt_ids(bundled.tokenizer, ask("Write a short story about a robot."))
    dec = Decoding(runner_for(bundled), prompt_ids, cfg, draft=bundled.draft)
    spec = dec.speculation
    dec.prefill()
    while len(dec.output_ids) < 20:
        dec.step()
        assert dec.cache.length == len(dec.ids) - 1
        assert spec.draft_cache.length <= len(dec.ids) - 1
    assert 0 < spec.accepted < spec.drafted  # some guesses were rejected and rolled back
    for runner, cache in ((runner_for(bundled), dec.cache), (bundled.draft.runner, spec.draft_cache)):
        fresh = runner.new_cache(cache.length)
        runner.forward(torch.tensor(dec.ids[: cache.length]), fresh)
        n = cache.length
        torch.testing.assert_close(cache.k[:, :, :, :n], fresh.k[:, :, :, :n], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(cache.v[:, :, :, :n], fresh.v[:, :, :, :n], atol=1e-4, rtol=1e-4)


def test_timeline_counters_use_glossary_names(bundled):
    done = run(bundled, ask(PROMPTS[0]), temperature=0.0, max_new_tokens=N_TOKENS, speculative="prompt_lookup")
    c = done.timeline.to_dict()
    for name in ("drafted", "accepted", "acceptance_rate", "tokens_per_step", "accepted_hist",
                 "target_forward_passes", "k_changes", "backoffs"):
        assert name in c, name
    assert c["accepted"] == sum(m * n for m, n in enumerate(c["accepted_hist"]))
    assert c["tokens_per_step"] >= 1.0
    # fewer target passes than tokens: speculation saved steps on this copy prompt
    assert c["target_forward_passes"] < c["output_tokens"]
    json.dumps(c)


def test_the_cost_model_is_measured_once_per_model_and_reported(tiny, tmp_path_factory, tokenizer):
    """Measured at first use on the model at hand, then fixed for the process (seeded replies stay
    reproducible); each request's Timeline says what the policy believed."""
    first = measured_costs(runner_for(tiny))
    assert first.measured and first.step_ms > 0 and first.verify_fixed >= 0 and first.verify_per_token >= 0
    assert measured_costs(runner_for(tiny)) is first
    done = run(tiny, ask("Hello there"), temperature=0.0, max_new_tokens=8, speculative="prompt_lookup")
    assert done.timeline.counters.speculation.cost_model == first.to_dict()
    fixed = run(tiny, ask("Hello there"), temperature=0.0, max_new_tokens=8, speculative="prompt_lookup",
                speculative_adaptive=False)
    assert fixed.timeline.counters.speculation.cost_model["measured"] is False  # k is fixed: nothing to decide
    from conftest import build_tiny_model_dir

    same = load_draft(str(build_tiny_model_dir(tmp_path_factory.mktemp("same"), tokenizer, seed=4)), tiny)
    cost = measured_draft_cost(same.runner, runner_for(tiny))
    assert cost > 0 and measured_draft_cost(same.runner, runner_for(tiny)) == cost


@pytest.mark.parametrize("max_batch", [1, 4])
def test_an_idle_engine_calibrates_so_the_first_speculative_request_measures_nothing(tiny_model_dir, max_batch,
                                                                                     monkeypatch):
    """The cost table is measured by the idle worker (both workers), not in the first speculative
    request's setup, where it cost ~5 s on the Zen 3; and a request that comes mid-calibration
    interrupts it."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.serving.service import Engine
    from engine.speculative import costs

    fresh = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))  # never measured
    assert not costs.is_calibrated(fresh.model)
    assert costs.calibrate_idle([(runner_for(fresh), None)], should_stop=lambda: True) is False  # gives way at once
    assert not costs.is_calibrated(fresh.model)
    engine = Engine(fresh, max_batch=max_batch)
    try:
        deadline = time.time() + 120
        while not costs.is_calibrated(fresh.model) and time.time() < deadline:
            time.sleep(0.05)
        assert costs.is_calibrated(fresh.model)
        calibrated = measured_costs(runner_for(fresh))

        def no_measuring(*args, **kwargs):
            raise AssertionError("a request measured the cost model")

        monkeypatch.setattr(costs, "_timed_forwards", no_measuring)
        done = engine.complete(ask("Repeat: one two three, one two three"),
                               GenerationConfig(temperature=0.0, max_new_tokens=8, speculative="prompt_lookup"))
        assert done.timeline.counters.speculation.cost_model == calibrated.to_dict()
    finally:
        engine.close()


def test_adaptive_k_uses_the_cost_model_it_is_given():
    """A verify pass that costs as much as two plain steps needs far better guesses to pay."""
    cheap = AdaptiveK(max_k=8, verify_fixed=0.05, verify_per_token=0.01)
    dear = AdaptiveK(max_k=8, verify_fixed=1.0, verify_per_token=0.1)
    for policy in (cheap, dear):
        for _ in range(10):
            policy.observe(4, 2)
    assert cheap.choose(room=100, free_probe=True) > dear.choose(room=100, free_probe=True)
    assert CostModel(0.2, 0.03).to_dict()["verify_fixed"] == 0.2


# --- speculative sampling keeps the target's distribution (tiny random models) ---------------------
def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the target gives probability 0 was sampled"
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    return float(1 - torch.distributions.Chi2(torch.tensor(float(keep.sum() - 1))).cdf(stat))


@pytest.fixture(scope="module")
def two_tiny(tiny, tmp_path_factory, tokenizer):
    """Target logits and draft logits for one context, from two different tiny random models."""
    from conftest import build_tiny_model_dir

    other = load_draft(str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny-draft"), tokenizer, seed=7)), tiny)
    ids = torch.tensor(tokenizer("Once upon a time there was")["input_ids"])
    t_cache, d_cache = tiny.model.new_cache(32), other.runner.new_cache(32)
    # Three consecutive positions, over the first 32 token ids only (so thousands of trials run in
    # seconds), sharpened: a random tiny model's logits are nearly flat.
    target = runner_for(tiny).forward(ids, t_cache, all_logits=True)[-3:, :32] * 8
    draft = other.runner.forward(ids, d_cache, all_logits=True)[-3:, :32] * 8
    return target, draft


@pytest.mark.parametrize("proposer", ["draft", "point_mass"])
def test_speculative_sampling_keeps_the_target_distribution(two_tiny, proposer):
    target_logits, draft_logits = two_tiny
    # top_k keeps the distributions small enough for a chi-square test. The draft's q mixes the
    # target's p with another model's distribution, so guesses are sometimes accepted and often
    # rejected (the residual path runs).
    cfg = GenerationConfig(temperature=1.0, top_k=8, top_p=1.0, seed=1234)
    sampler = Sampler(cfg)
    p = sampler.probs(target_logits)
    q = 0.5 * p[:2] + 0.5 * sampler.probs(draft_logits[:2])
    trials, first, rejected = 20000, torch.zeros(p.shape[-1]), 0
    for _ in range(trials):
        if proposer == "draft":
            guesses = [sampler.draw(q[0]), sampler.draw(q[1])]
            out = verify_sampling(guesses, q, target_logits, sampler)
        else:  # prompt lookup: a fixed guess, q a point mass on it
            guesses = [int(q[0].argmax()), int(q[1].argmax())]
            out = verify_sampling(guesses, None, target_logits, sampler)
        first[out[0]] += 1
        rejected += out[0] != guesses[0]
    assert rejected > trials * 0.2  # the residual path ran often
    assert _chi_square_p(first, p[0]) > 1e-3


def test_speculative_sampling_after_an_accepted_guess(two_tiny):
    """The second token, given the first guess was accepted, follows the target's next distribution.
    (verify_sampling takes row i as the distribution after guess i-1; the rows' origin does not matter.)"""
    target_logits, draft_logits = two_tiny
    sampler = Sampler(GenerationConfig(temperature=1.0, top_k=8, top_p=1.0, seed=99))
    p = sampler.probs(target_logits)
    g0 = int(p[0].argmax())  # a likely first guess, so it is often accepted
    q1 = sampler.probs(draft_logits[1])
    second = torch.zeros(p.shape[-1])
    for _ in range(20000):
        out = verify_sampling([g0, sampler.draw(q1)], torch.stack([torch.nn.functional.one_hot(
            torch.tensor(g0), p.shape[-1]).float(), q1]), target_logits, sampler)
        if out[0] == g0 and len(out) >= 2:
            second[out[1]] += 1
    assert second.sum() > 2000
    assert _chi_square_p(second, p[1]) > 1e-3


def test_seeded_speculative_sampling_is_reproducible(bundled):
    cfg = dict(temperature=0.8, top_p=0.95, max_new_tokens=16, speculative="draft", seed=42)
    a = run(bundled, ask("Tell me about the sea."), **cfg).token_ids
    b = run(bundled, ask("Tell me about the sea."), **cfg).token_ids
    assert a == b and len(a) == 16


def test_adaptive_backoff_engages_on_the_model_when_guesses_never_match(tiny, tmp_path_factory, tokenizer):
    from conftest import build_tiny_model_dir

    bad_draft = load_draft(str(build_tiny_model_dir(tmp_path_factory.mktemp("bad"), tokenizer, seed=3)), tiny)
    with torch.no_grad():  # two random tiny models can both fall into repeating one token: make its guesses
        bad_draft.model.norm.weight.neg_()  # the least likely tokens (its logits negated), so they never match
    tiny.draft = bad_draft
    try:
        done = run(tiny, ask("Hello there"), temperature=0.0, max_new_tokens=60, speculative="draft",
                   num_speculative_tokens=4)
        plain = run(tiny, ask("Hello there"), temperature=0.0, max_new_tokens=60)
    finally:
        tiny.draft = None
    c = done.timeline.counters
    assert done.token_ids == plain.token_ids
    # a draft as big as the target never pays (its cost model says so before any guess); either way
    # the policy ends at k = 0 and guesses far less than 4 per step
    assert c.speculation.k_changes and c.speculation.k_changes[-1]["k"] == 0
    assert c.speculation.drafted < 60


# --- cancellation and errors ---------------------------------------------------------------------
def test_cancellation_mid_stream_with_speculation(bundled, plain_greedy):
    chunks, made = [], []
    tl = Timeline()
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=N_TOKENS, speculative="prompt_lookup",
                           speculative_adaptive=False)

    def keep(*args, **kwargs):  # the sequence, to look at once it is done
        made.append(Decoding(*args, **kwargs))
        return made[-1]

    gen = generate(runner_for(bundled), bundled.tokenizer, bundled.eos_token_ids,
                   Request(messages=ask(PROMPTS[0]), config=cfg),
                   tl, should_stop=lambda: len(chunks) >= 3, decoding_factory=keep)
    for event in gen:
        if event.kind == "chunk":
            chunks.append(event)
    assert event.kind == "done" and event.detail["finish_reason"] == "cancelled"
    got = event.token_ids
    assert 3 <= len(got) < N_TOKENS and got == plain_greedy[PROMPTS[0]][: len(got)]
    dec, = made
    assert dec.cache.length == len(dec.ids) - 1 and dec.output_ids == got  # consistent, reusable


def test_cancel_through_the_worker_keeps_it_serving(bundled_engine):
    cfg = GenerationConfig(temperature=0.0, max_new_tokens=200, speculative="draft")
    handle = bundled_engine.submit(ask("Write a long essay about rivers."), cfg)
    for event in handle.events(timeout=120):
        if event.kind == "chunk":
            handle.cancel()
    assert event.kind == "done" and event.detail["finish_reason"] == "cancelled"
    after = bundled_engine.complete(ask("Name a color."), GenerationConfig(temperature=0.0, max_new_tokens=4,
                                                                           speculative="draft"))
    assert after.output_tokens == 4


def test_draft_mode_without_a_draft_is_a_clear_error(tiny):
    assert tiny.draft is None
    with pytest.raises(InvalidRequest, match="draft-model"):
        run(tiny, ask("Hi"), temperature=0.0, max_new_tokens=4, speculative="draft")


def test_invalid_speculative_options_are_rejected():
    with pytest.raises(InvalidRequest):
        GenerationConfig(speculative="maybe")
    with pytest.raises(InvalidRequest):
        GenerationConfig(num_speculative_tokens=0)
    with pytest.raises(InvalidRequest):
        GenerationConfig(speculative_adaptive="yes")


def test_a_draft_with_another_tokenizer_is_refused(tiny, tmp_path_factory, tokenizer):
    from conftest import build_tiny_model_dir

    other_tok = copy.deepcopy(tokenizer)
    other_tok.add_tokens(["<not-in-the-target>"])
    path = build_tiny_model_dir(tmp_path_factory.mktemp("other-tok"), other_tok)
    with pytest.raises(LoadError, match="tokenizer"):
        load_draft(str(path), tiny)


def test_plain_decoding_is_unchanged_by_the_toggle_plumbing(bundled, plain_greedy):
    done = run(bundled, ask(PROMPTS[6]), factory=Decoding, temperature=0.0, max_new_tokens=N_TOKENS)
    assert done.token_ids == plain_greedy[PROMPTS[6]]
    assert done.timeline.counters.speculation is None
