"""Loading: the bundled model, a local folder, and clear errors for everything else."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.core.config import LoadConfig
from engine.core.errors import InvalidRequest, LoadError
from engine.model.loader import load, resolve_dtype

ROOT = Path(__file__).resolve().parents[1]


def test_bundled_model_facts(bundled):
    info = bundled.info()
    assert info["name"] == "SmolLM2-135M-Instruct" and info["fast_path"]
    assert bundled.max_context == 8192
    assert bundled.model.vocab_size == 49152 and len(bundled.model.blocks) == 30
    assert bundled.tokenizer.convert_tokens_to_ids("<|im_end|>") in bundled.eos_token_ids
    # fp32: ~134.5M parameters (tied embeddings counted once) x 4 bytes
    assert 530e6 < info["weight_bytes"] < 545e6


def test_local_folder_loads_and_generates(tiny):
    assert tiny.source == "folder" and tiny.fast_path
    from engine.bench import run_request
    from engine.core.config import GenerationConfig

    done = run_request(tiny, [{"role": "user", "content": "hi"}], GenerationConfig(max_new_tokens=5, temperature=0))
    assert done.output_tokens >= 1


def test_no_fast_path_uses_transformers_forward(tiny_model_dir):
    lm = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False, fast_path=False))
    assert not lm.fast_path and any("generic" in n for n in lm.notes)


@pytest.mark.parametrize("spec, message", [
    ("/nonexistent/model", "no such file or folder"),
    ("./missing.gguf", "no such file or folder"),
])
def test_unknown_paths(spec, message):
    with pytest.raises(LoadError, match=message):
        load(LoadConfig(model=spec, progress=False))


def test_corrupt_gguf_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(LoadError, match="could not load a model"):
        load(LoadConfig(model=str(bad), progress=False, cache_dir=tmp_path / "cache"))


def test_a_file_that_is_not_a_model(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(LoadError, match="not a .gguf model"):
        load(LoadConfig(model=str(text), progress=False))


def test_folder_without_config(tmp_path):
    with pytest.raises(LoadError, match="config.json"):
        load(LoadConfig(model=str(tmp_path), progress=False))


def test_hub_id_offline_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    t = time.perf_counter()
    with pytest.raises(LoadError, match="cannot be reached"):
        load(LoadConfig(model="someone/some-model", progress=False))
    assert time.perf_counter() - t < 30  # a clear message, not minutes of retries


def test_bad_load_options():
    with pytest.raises(InvalidRequest, match="--dtype"):
        LoadConfig(dtype="int3")
    with pytest.raises(InvalidRequest, match="--threads"):
        LoadConfig(threads=0)


def test_auto_dtype_is_a_real_dtype():
    import torch

    assert resolve_dtype("auto", torch.device("cpu")) in (torch.bfloat16, torch.float32)


def cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_cli_json_end_to_end():
    import json

    r = cli("What is the capital of France?", "--temperature", "0", "--max-new-tokens", "20", "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert "Paris" in out["text"]
    tl = out["timeline"]
    assert tl["ttft_ms"] <= tl["e2e_ms"] and tl["output_tokens"] == len(tl["token_ms"])


@pytest.mark.parametrize("args, message, code", [
    (["", "--max-new-tokens", "4"], "prompt is empty", 2),  # usage
    (["hi", "--max-new-tokens", "0"], "max_new_tokens", 2),
    (["hi", "--temperature", "-2"], "temperature", 2),
    (["hi", "--model", "/no/such/model"], "no such file", 1),  # a model that cannot load: a runtime failure
])
def test_cli_bad_input_is_one_clear_line(args, message, code):
    r = cli(*args, timeout=120)
    assert r.returncode == code
    assert message in r.stderr and "Traceback" not in r.stderr


def test_cli_flags_reach_the_generation_config():
    from engine.cli import build_parser, generation_config_from_args

    args = build_parser().parse_args(["hi", "--speculative", "prompt_lookup", "--num-speculative-tokens", "6",
                                      "--no-speculative-adaptive", "--chunked-prefill", "--prefill-chunk-tokens",
                                      "64", "--no-kv-reuse", "--quantization", "int8"])
    cfg = generation_config_from_args(args)
    assert (cfg.speculative, cfg.num_speculative_tokens, cfg.speculative_adaptive, cfg.chunked_prefill,
            cfg.prefill_chunk_tokens, cfg.kv_reuse, cfg.quantization) == ("prompt_lookup", 6, False, True, 64,
                                                                         False, "int8")
    assert not generation_config_from_args(build_parser().parse_args(["hi"])).chunked_prefill


BENCHES = [(package, name) for package in ("engine.bench", "server.bench")
           for name in sorted(__import__(package, fromlist=["SCENARIOS"]).SCENARIOS)]


@pytest.mark.parametrize("package, scenario", BENCHES)
def test_every_bench_scenario_parses_its_flags(package, scenario):
    """A scenario's own flags must not clash with the load flags every scenario gets (a clash
    broke `bench load` once, unseen, because tests call its functions, not its command line)."""
    build_parser = __import__(package, fromlist=["build_parser"]).build_parser

    parser, module = build_parser([scenario, "--json"])
    args = parser.parse_args([scenario, "--json"])
    assert args.scenario == scenario and callable(module.run)
