"""Shared fixtures. The bundled model is loaded once per test session (fp32, so exactness
tests compare like with like); unit tests use a tiny random Llama built from a config.

Tiers (markers, declared in pytest.ini) are given here, from what a test uses, so a new test is
tiered without anyone remembering to: `bundled` when its fixtures reach the bundled model (other
than through `tokenizer`, which the tiny model borrows), else `tiny`; `browser` under
tests/ui_browser/; `kernels` when its module imports our C++ kernels (engine.kernels). `slow` is
given by hand, in SLOW and SLOW_FIXTURES below (or by a test file's own `pytestmark`, as
tests/test_packaging.py's), to what takes long: compiles, load runs, fuzzing, subprocesses that
load the model, the wheel build.
`make test-fast` runs `-m "not slow and not browser"`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite asserts CPU bit-exactness (fp32 greedy replies identical alone, batched, after KV reuse): pin
# `--device auto` to CPU for every load here and in every subprocess (app.py, python -m engine, the
# benches inherit the environment; engine/platform/device.py reads it). A test meant for a GPU passes
# device="cuda" and is marked `cuda` (skipped with its reason where torch sees none).
os.environ.setdefault("LATENCY_LAB_DEVICE", "cpu")


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2-135M-Instruct, fp32, fast path."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load
    from engine.speculative.draft import load_draft

    lm = load(LoadConfig(dtype="fp32", device="cpu", progress=False))
    lm.draft = load_draft(None, lm)
    return lm


@pytest.fixture(scope="session")
def bundled_engine(bundled):
    from engine.serving.service import Engine

    engine = Engine(bundled)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tokenizer(bundled):
    return bundled.tokenizer


def build_tiny_model_dir(path: Path, tokenizer, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    """A small random model (real tokenizer, 2 layers) saved as a transformers folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **{**sizes, **overrides},  # overrides win
    )
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    return load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", device="cpu", progress=False))


# --- tiers ---------------------------------------------------------------------------------------------

# Slow, by hand (nothing in a test says how long it runs): `make test-fast` leaves these out. A file
# name, or file::test (the function's name, every parameter); why, in a few words. Measured with
# `pytest --durations=0` on the files concerned; an entry that matches no test marks nothing.
SLOW = {
    "test_compiled_step.py": "torch.compile of a whole decode step, test after test",
    "test_reliability.py": "load runs through the API, twice, and the fault drills",
    "test_fuzz_api.py": "hundreds of fuzzed requests over HTTP to the bundled model",
    "test_fuzz_page.py": "fuzzed requests through the whole app, gradio_client included",
    "test_quantize.py": "builds every weight variant of the bundled model and decodes with each",
    "test_batching.py::test_compiled_step_requests_run_unbatched_beside_the_batch": "torch.compile",
    "test_batching.py::test_under_load_batched_replies_are_exact_and_nothing_is_lost": "a load run",
    "test_loader.py::test_cli_json_end_to_end": "the CLI in a subprocess, loading the model",
    "test_loader.py::test_cli_bad_input_is_one_clear_line": "the CLI in a subprocess, per case",
    "test_auth.py::test_every_route_refuses_a_request_without_the_key": "every route of the whole app",
    "test_auth.py::test_with_the_key_the_routes_are_let_in": "every route of the whole app",
    "test_report.py::test_report_quick_runs_the_suite_and_writes_one_dated_folder": "five benches, each in a subprocess",
    "test_ui_stats_aa.py::test_the_corrected_tests_alone_hold_alpha_over_thousands_of_aa_draws": "6,000 A/A tables",
}
# ...and every test that uses one of these fixtures (a test module's own, by name)
SLOW_FIXTURES = {
    "plain_greedy": "long greedy replies to every prompt, then the same with speculation (test_speculative.py)",
    "two_tiny": "thousands of speculative draws against the target's distribution (test_speculative.py)",
}

BUNDLED_FIXTURES = {"bundled", "bundled_engine"}
NOT_BUNDLED_THROUGH = {"tokenizer"}  # the tiny model's tokenizer comes from the bundled one: still "tiny"


def _reaches_bundled(item) -> bool:
    """Whether the test's fixtures reach the bundled model other than through NOT_BUNDLED_THROUGH."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a plain test function (a doctest...): what it requests, closure and all
        return bool(BUNDLED_FIXTURES & set(getattr(item, "fixturenames", ())))
    seen, todo = set(), list(info.initialnames)
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_BUNDLED_THROUGH:
            continue
        seen.add(name)
        for fixturedef in info.name2fixturedefs.get(name, ()):
            todo.extend(fixturedef.argnames)
    return bool(BUNDLED_FIXTURES & seen)


def _imports_kernels(module) -> bool:
    for value in vars(module).values() if module is not None else ():
        name = getattr(value, "__name__", "") if isinstance(value, type(sys)) else getattr(value, "__module__", "")
        if isinstance(name, str) and name.startswith("engine.kernels"):
            return True
    return False


def _cuda_usable() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    kernels_modules: dict[str, bool] = {}
    for item in items:
        path = Path(str(item.path))
        if "ui_browser" in path.parts:
            item.add_marker(pytest.mark.browser)
        module = getattr(item, "module", None)
        if module is not None and module.__name__ not in kernels_modules:
            kernels_modules[module.__name__] = _imports_kernels(module)
        if module is not None and kernels_modules[module.__name__]:
            item.add_marker(pytest.mark.kernels)
        item.add_marker(pytest.mark.bundled if _reaches_bundled(item) else pytest.mark.tiny)
        name = getattr(item, "originalname", item.name)
        if item.get_closest_marker("cuda") and not _cuda_usable():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU torch can use; "
                                                    "`python -m engine.platform.device` says why there is none"))
        if path.name in SLOW or f"{path.name}::{name}" in SLOW or SLOW_FIXTURES.keys() & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
