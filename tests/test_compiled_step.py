"""The compiled decode step (engine/runtime/compiled.py, the `compiled_decode` toggle, a step mode of the
runner): the same tokens as the eager step where it runs, a clear refusal where it cannot, its fallback paths."""

import os

import pytest
import torch
from support import ask

from engine.core.config import GenerationConfig, LoadConfig
from engine.core.errors import InvalidRequest
from engine.core.request import Request
from engine.core.timeline import Timeline
from engine.bench import runner_for
from engine.platform import capabilities
from engine.runtime import compiled as compiled_step
from engine.runtime.plan import make_plan
from engine.runtime.runner import Runner
from engine.serving.generate import generate

NO_COMPILER = "no C++ compiler on PATH: torch.compile cannot build CPU code here (the refusal is tested below)"
needs_compiler = pytest.mark.skipif(not capabilities.detect().cpp_compiler, reason=NO_COMPILER)


def run(lm, messages, runner=None, **cfg):
    tl = Timeline()
    tl.enqueued_ns = tl.started_ns = tl.received_ns
    events = list(generate(runner or runner_for(lm), lm.tokenizer, lm.eos_token_ids,
                           Request(messages=messages, config=GenerationConfig(**cfg)), tl))
    return events[-1]


@needs_compiler
def test_compiled_greedy_is_the_eager_greedy_in_fp32(bundled):
    """fp32, bundled model: the compiled step picks the same tokens as the eager one, prompt after
    prompt; the first request compiles (its setup shows compile_ms), later ones reuse the graph."""
    prompts = ["Explain what a CPU cache is in two sentences.", "Write a haiku about the sea."]
    for i, prompt in enumerate(prompts):
        eager = run(bundled, ask(prompt), temperature=0.0, max_new_tokens=32)
        compiled = run(bundled, ask(prompt), temperature=0.0, max_new_tokens=32, compiled_decode=True)
        assert compiled.token_ids == eager.token_ids
        counters = compiled.timeline.counters
        assert counters.decode_step == "compiled"
        assert (counters.compile_ms is not None) == (i == 0 and runner_for(bundled).compiled_info()["compile_s"] > 0)
        assert eager.timeline.counters.decode_step is None
    info = runner_for(bundled).compiled_info()
    assert info["top1_agreement"] == 1.0 and info["positions"] >= 16
    assert info["max_logit_diff"] < 1e-2  # fp32 rounding in another order, not a different computation


def test_compiled_graphs_are_cached_in_a_folder_per_cpu(monkeypatch):
    """Inductor's cache does not key on the instruction set (a graph built for one CPU is a hit on
    another): the engine keeps a folder per CPU, and leaves a folder the user chose alone."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    here = compiled_step.cache_per_cpu()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == here
    assert os.path.basename(here).startswith(f"cpu-{capabilities.detect().torch_cpu_capability.lower()}-")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # Inductor's own default: not a choice
    assert compiled_step.cache_per_cpu() == here
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with capabilities.forced(isa=("avx2", "fma")):  # another CPU
        assert compiled_step.cache_per_cpu() != here
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/users-own")
    assert compiled_step.cache_per_cpu() is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/users-own"


@needs_compiler
def test_compiled_int4_step_measures_its_agreement_and_serves(bundled):
    """A 4-bit weight-only variant, the case the toggle is for: its agreement with its own eager
    step is measured at compile time, and a request through it streams a normal reply."""
    from engine.serving.variants import VariantSet

    variant = VariantSet(bundled, quality_texts=0).get("int4wo+head")
    done = run(variant.loaded, ask("List three fruits that are red."), runner=variant.runner, temperature=0.0,
               max_new_tokens=24, compiled_decode=True)
    info = variant.runner.compiled_info()
    assert done.output_tokens == 24 or done.detail["finish_reason"] == "stop"
    assert done.timeline.counters.decode_step == "compiled"
    assert info["top1_agreement"] >= 0.9, info  # measured on a real text; the eager step is the reference
    assert info["compiled_ms"] > 0 and info["eager_ms"] > 0


def test_without_a_compiler_the_request_is_refused_and_the_model_keeps_serving(tiny_model_dir):
    """The fallback a machine without g++ takes: an InvalidRequest naming the toggle and the way
    out, before any token; the same model then answers the request without the toggle."""
    from engine.model.loader import load

    lm = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))  # never compiled
    with capabilities.forced(cpp_compiler=None):
        with pytest.raises(InvalidRequest) as err:
            run(lm, ask("hi"), temperature=0.0, max_new_tokens=4, compiled_decode=True)
    assert err.value.param == "compiled_decode"
    assert "C++ compiler" in str(err.value) and "Compiled step off" in str(err.value)
    assert runner_for(lm).compiled_info() is None  # nothing half-built was kept
    assert run(lm, ask("hi"), temperature=0.0, max_new_tokens=4).output_tokens == 4


def test_models_the_graph_cannot_trace_are_refused_with_the_reason(tiny_model_dir):
    from engine.model.loader import load

    generic = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False, fast_path=False))
    assert "generic transformers" in make_plan(generic.model).compiled_reason
    with pytest.raises(InvalidRequest, match="generic transformers"):
        runner_for(generic).prepare("compiled", generic.tokenizer)
    bf16 = load(LoadConfig(model=str(tiny_model_dir), dtype="bf16", progress=False))
    # a bf16 model's plain linears take one-row matmuls with oneDNN off (Kernel.ATEN_NO_ONEDNN),
    # which a graph cannot switch: refused with what to pick instead, whatever the CPU
    assert "int4wo+head" in make_plan(bf16.model).compiled_reason


@needs_compiler
def test_a_bf16_model_whose_every_linear_is_weight_only_compiles(tiny_model_dir):
    """What an AVX-512 BF16 machine loads by default (bf16): its int8wo+head variant has no plain
    linear left, so its step compiles, and picks the eager step's tokens."""
    from engine.model.loader import load
    from engine.serving.variants import build

    bf16 = load(LoadConfig(model=str(tiny_model_dir), dtype="bf16", progress=False))
    variant, runner = build(bf16, "int8wo+head")
    assert runner.plan.compiled_reason is None
    runner.prepare("compiled", variant.tokenizer)
    assert runner.compiled_info()["top1_agreement"] >= 0.9
    eager = run(variant, ask("hi"), runner=runner, temperature=0.0, max_new_tokens=8)
    compiled = run(variant, ask("hi"), runner=runner, temperature=0.0, max_new_tokens=8, compiled_decode=True)
    assert compiled.timeline.counters.decode_step == "compiled" and compiled.output_tokens == eager.output_tokens


@needs_compiler
def test_bf16wo_compiles_its_panel_products_and_picks_the_eager_tokens(tiny):
    """bf16wo's products are our panel op over bf16 panels (an opaque call in the graph, as fp32's are):
    the compiled step serves it and picks the eager step's tokens."""
    from engine.serving.variants import build

    variant, runner = build(tiny, "bf16wo+head")
    assert runner.plan.compiled_reason is None
    runner.prepare("compiled", variant.tokenizer)
    assert runner.compiled_info()["top1_agreement"] == 1.0
    eager = run(variant, ask("hi"), runner=runner, temperature=0.0, max_new_tokens=8)
    compiled = run(variant, ask("hi"), runner=runner, temperature=0.0, max_new_tokens=8, compiled_decode=True)
    assert compiled.timeline.counters.decode_step == "compiled" and compiled.token_ids == eager.token_ids


@needs_compiler
def test_a_grown_cache_keeps_the_graph_and_the_tokens(tiny):
    """The cache's capacity is dynamic in the graph: a cache that grows mid-reply (reallocated)
    keeps the compiled step and gives the tokens of the eager step."""
    m = Runner(tiny.model, make_plan(tiny.model))
    m.prepare("compiled", tiny.tokenizer)
    ids = torch.arange(5, 25)
    eager, compiled = m.new_cache(21), m.new_cache(21)
    m.forward(ids, eager)
    m.forward(ids, compiled)
    for tok in range(30, 45):  # past the capacity of 21: both caches grow
        t = torch.tensor([tok])
        want, got = m.forward(t, eager), m.forward(t, compiled, mode="compiled")
        assert int(got.argmax()) == int(want.argmax())
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert compiled.capacity > 21 and compiled.length == eager.length


def test_a_compile_failure_is_an_error_once_and_the_eager_step_keeps_serving(tiny_model_dir, monkeypatch):
    """Inductor failing (a broken compiler, a lowering it lacks) must not take the worker down: the
    request gets an InvalidRequest with the cause, the failure is remembered (not retried for every
    request), and requests without the toggle are served."""
    from engine.model.loader import load

    lm = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
    calls = []

    def broken_compile(fn, **kw):
        calls.append(fn)

        def run(*args):
            raise RuntimeError("C++ compile error: cc1plus: out of memory")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    with capabilities.forced(cpp_compiler="/usr/bin/g++"):
        for _ in range(2):
            with pytest.raises(InvalidRequest, match="cc1plus: out of memory"):
                run(lm, ask("hi"), temperature=0.0, max_new_tokens=4, compiled_decode=True)
    assert len(calls) == 1
    assert run(lm, ask("hi"), temperature=0.0, max_new_tokens=4).output_tokens == 4


@needs_compiler
def test_a_variant_built_after_compiling_gets_its_own_step(tiny):
    """Variants are deep copies of the loaded model: one built after the loaded model's runner compiled
    its step must build (nothing compiled hangs on the model to copy) and start without a compiled step."""
    from engine.serving.variants import build

    runner_for(tiny).prepare("compiled", tiny.tokenizer)
    _, variant = build(tiny, "int8wo")
    assert variant.compiled_info() is None
    assert runner_for(tiny).compiled_info()["positions"] > 0
