"""THE forward (engine/runtime/runner.py): one runner method computes every logit the engine produces.
Prefill, decode, batched decode and speculative verification each through `Runner.run`, against the
transformers forward and against each other, and every forward a served reply runs inside `run`."""

from __future__ import annotations

import threading

import pytest
import torch
from support import ask

from engine.bench import runner_for
from engine.core.config import GenerationConfig
from engine.runtime import eager
from engine.runtime.runner import Batch, Runner

ATOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny.weights, dtype=torch.float32).eval()


def test_prefill_and_decode_through_run_give_the_transformers_logits(tiny, reference):
    runner = runner_for(tiny)
    ids = torch.arange(200, 216)
    with torch.inference_mode():
        want = reference(ids[None]).logits[0]
    cache = runner.new_cache(4)  # too small on purpose: it grows
    prefill = runner.run(Batch([ids[:10]], [cache], all_logits=True))
    assert prefill.shape == (10, runner.vocab_size) and cache.length == 10
    last = runner.run(Batch([ids[:10]], [runner.new_cache(16)]))
    assert last.shape == (1, runner.vocab_size) and torch.equal(last[0], prefill[-1])  # the last row, the same bits
    steps = [runner.run(Batch([ids[i : i + 1]], [cache])) for i in range(10, 16)]
    torch.testing.assert_close(prefill, want[:10], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(torch.cat(steps), want[10:], atol=ATOL, rtol=ATOL)


def test_batched_decode_through_run_gives_each_sequence_its_alone_bits(tiny):
    runner = runner_for(tiny)
    prompts = [list(range(10, 30)), list(range(40, 45)), list(range(60, 100))]

    def primed():
        caches = [runner.new_cache(64) for _ in prompts]
        for c, p in zip(caches, prompts):
            runner.run(Batch([p], [c]))
        return caches

    alone_caches, together_caches = primed(), primed()
    for step in range(3):
        tokens = [[7 + step], [8 + step], [9 + step]]
        alone = torch.cat([runner.run(Batch([t], [c])) for t, c in zip(tokens, alone_caches)])
        together = runner.run(Batch(tokens, together_caches))
        assert together.shape == (3, runner.vocab_size) and torch.equal(together, alone)


def test_verification_through_run_scores_every_row_and_rolls_back(tiny):
    runner = runner_for(tiny)
    prompt, guesses = list(range(300, 320)), [5, 6, 7]
    verify_cache, step_cache = runner.new_cache(32), runner.new_cache(32)
    for c in (verify_cache, step_cache):
        runner.run(Batch([prompt[:-1]], [c]))
    rows = runner.run(Batch([[prompt[-1], *guesses]], [verify_cache], all_logits=True))
    assert rows.shape == (4, runner.vocab_size) and verify_cache.length == len(prompt) + 3
    one_by_one = torch.cat([runner.run(Batch([[t]], [step_cache])) for t in [prompt[-1], *guesses]])
    torch.testing.assert_close(rows, one_by_one, atol=ATOL, rtol=ATOL)  # row i scores the token after guess i
    verify_cache.crop(len(prompt))  # a rejection: back to the committed tokens
    again = runner.run(Batch([[guesses[0]]], [verify_cache]))
    torch.testing.assert_close(again, rows[1:2], atol=ATOL, rtol=ATOL)


def test_a_runner_holds_its_own_state_and_nothing_hangs_on_the_model(tiny):
    before = set(vars(tiny.model))
    runner = Runner(tiny.model, runner_for(tiny).plan)
    runner.run(Batch([[1, 2, 3]], [runner.new_cache(8)]))
    assert set(vars(tiny.model)) == before


def test_every_forward_of_a_served_reply_runs_inside_run(tiny, monkeypatch):
    """Plain, batched and speculative replies through an Engine: each eager forward they take is called
    from inside Runner.run (the one way a logit is computed), and run was called."""
    from engine.serving.service import Engine

    inside, outside, runs = threading.local(), [], []
    real_run, real_forward = Runner.run, eager.forward

    def run(self, batch):
        inside.depth = getattr(inside, "depth", 0) + 1
        runs.append(len(batch.rows))
        try:
            return real_run(self, batch)
        finally:
            inside.depth -= 1

    def forward(*args, **kwargs):
        if not getattr(inside, "depth", 0) and threading.current_thread().name == "model-worker":
            outside.append(args[2:4])
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(Runner, "run", run)
    monkeypatch.setattr(eager, "forward", forward)
    engine = Engine(tiny, max_batch=2)
    try:
        cfgs = [GenerationConfig(temperature=0.0, max_new_tokens=6),
                GenerationConfig(temperature=0.0, max_new_tokens=6, speculative="prompt_lookup",
                                 speculative_adaptive=False)]
        handles = [engine.submit(ask("Repeat: one two three, one two three"), c) for c in cfgs * 2]
        assert all(h.result(timeout=300).output_tokens > 0 for h in handles)
    finally:
        engine.close()
    assert runs and max(runs) == 2 and outside == []
