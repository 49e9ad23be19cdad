"""The decode loop on the bundled model: exactness against transformers, sampling, stopping."""

import pytest
import torch

from engine.core.config import GenerationConfig
from engine.core.request import Request
from engine.core.timeline import Timeline
from engine.serving.generate import build_prompt_ids, generate
from engine.bench import runner_for

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List three fruits that are red.",
    "How do I reverse a list in Python?",
]


def run(lm, messages, **cfg):
    tl = Timeline()
    tl.enqueued_ns = tl.started_ns = tl.received_ns
    events = list(generate(runner_for(lm), lm.tokenizer, lm.eos_token_ids,
                           Request(messages=messages, config=GenerationConfig(**cfg)), tl))
    return events, events[-1]


@pytest.fixture(scope="module")
def reference(bundled):
    from engine.model.loader import load_reference

    return load_reference(bundled)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_transformers_generate(bundled, reference, prompt):
    messages = [{"role": "user", "content": prompt}]
    _, done = run(bundled, messages, temperature=0.0, max_new_tokens=24)
    ids = torch.tensor([build_prompt_ids(bundled.tokenizer, messages)])
    with torch.inference_mode():
        want = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                  eos_token_id=sorted(bundled.eos_token_ids), pad_token_id=2,
                                  temperature=None, top_p=None, top_k=None)[0, ids.shape[1]:].tolist()
    assert done.token_ids == want
    assert done.text == bundled.tokenizer.decode(
        [t for t in want if t not in bundled.eos_token_ids], skip_special_tokens=True)


def test_capital_of_france_is_answered_coherently(bundled):
    _, done = run(bundled, [{"role": "user", "content": PROMPTS[0]}], temperature=0.0, max_new_tokens=24)
    assert "Paris" in done.text
    assert done.detail["finish_reason"] == "stop"


def test_seeded_sampling_is_reproducible_and_seed_matters(bundled):
    msgs = [{"role": "user", "content": "Tell me a short story about a robot."}]
    cfg = dict(temperature=1.0, top_p=0.95, top_k=50, max_new_tokens=20)
    a = run(bundled, msgs, seed=1234, **cfg)[1].token_ids
    b = run(bundled, msgs, seed=1234, **cfg)[1].token_ids
    c = run(bundled, msgs, seed=99, **cfg)[1].token_ids
    assert a == b
    assert a != c


def test_timeline_invariants(bundled):
    events, done = run(bundled, [{"role": "user", "content": PROMPTS[2]}], temperature=0.0, max_new_tokens=16)
    tl = done.timeline
    chunks = [e for e in events if e.kind == "chunk"]
    assert tl.output_tokens == len(done.token_ids) == sum(len(c.token_ids) for c in chunks)
    assert tl.prompt_tokens == len(build_prompt_ids(bundled.tokenizer, [{"role": "user", "content": PROMPTS[2]}]))
    stamps = [tl.received_ns, tl.started_ns, tl.setup_done_ns, tl.prefill_start_ns, *tl.token_ns, tl.done_ns]
    assert stamps == sorted(stamps)
    m = tl.metrics()
    assert 0 < m["prefill_ms"] <= m["ttft_ms"] <= m["e2e_ms"]
    assert len(tl.itl_ms) == tl.output_tokens - 1
    assert "".join(c.text for c in chunks) == done.text


def test_max_new_tokens_stops_with_length(bundled):
    _, done = run(bundled, [{"role": "user", "content": "Count from one to one hundred in words."}],
                  temperature=0.0, max_new_tokens=5)
    assert done.output_tokens == 5 and done.detail["finish_reason"] == "length"


def test_stop_string_ends_the_reply_and_is_not_shown(bundled):
    msgs = [{"role": "user", "content": "Count from one to ten, separated by commas."}]
    _, free = run(bundled, msgs, temperature=0.0, max_new_tokens=40)
    assert "five" in free.text.lower() or "5" in free.text
    stop = "5" if "5" in free.text else "five"
    _, done = run(bundled, msgs, temperature=0.0, max_new_tokens=40, stop=(stop,))
    assert done.detail["finish_reason"] == "stop"
    assert stop not in done.text
    assert free.text.startswith(done.text)
    assert done.output_tokens < free.output_tokens


def test_cancellation_mid_stream(bundled):
    tl = Timeline()
    seen = []
    gen = generate(runner_for(bundled), bundled.tokenizer, bundled.eos_token_ids,
                   Request(messages=[{"role": "user", "content": "Write a long essay about rivers."}],
                           config=GenerationConfig(temperature=0.0, max_new_tokens=200)),
                   tl, should_stop=lambda: len(seen) >= 3)
    for event in gen:
        if event.kind == "chunk":
            seen.append(event)
    assert event.kind == "done" and event.detail["finish_reason"] == "cancelled"
    assert event.output_tokens == 3 and tl.finish_reason == "cancelled"


def test_a_vanishing_temperature_samples_the_argmax_instead_of_failing():
    """T = 1e-50 underflows float32 (logits / T would be NaN); its limit, greedy, is what is drawn."""
    from engine.serving.sampling import Sampler

    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    for t in (1e-50, 1e-8):
        s = Sampler(GenerationConfig(temperature=t, seed=1))
        assert s.greedy and s.sample(logits) == 1
        assert torch.equal(s.probs(logits), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    warm = Sampler(GenerationConfig(temperature=1e-3, seed=1))  # small but representable: still sampling
    assert not warm.greedy and warm.sample(logits) == 1 and torch.isfinite(warm.probs(logits)).all()
