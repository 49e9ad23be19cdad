"""The prepared GPU check (`python -m engine.bench gpu`): on a CPU with tiny shapes every stage runs (the
8B shape says "no CUDA"), so the first GPU run meets no Python bug; its verdict logic is checked with
a GPU's figures fed in; the time budget skips stages with the reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import gpu
from engine.quant.quantize import METHODS

ROOT = Path(__file__).resolve().parents[1]
STAGE_NAMES = [s[0] for s in gpu.STAGES]


def _check_stages(result):
    assert list(result["stages"]) == STAGE_NAMES
    for name, stage in result["stages"].items():
        assert "error" not in stage, (name, stage.get("error"), stage.get("trace"))
        if "skipped" in stage:
            assert isinstance(stage["skipped"], str) and stage["skipped"], name
        else:
            assert stage["ok"] is True and stage["figures"], name


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    env = {**os.environ, "LATENCY_LAB_CACHE": str(tmp_path_factory.mktemp("cache")), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "engine.bench", "gpu", "--device", "cpu", "--shapes", "tiny",
                          "--limits-seconds", "0.5", "--budget-s", "900"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
    return run


@pytest.mark.slow
def test_tiny_cpu_run_has_every_stage_and_one_json_line(tiny_run):
    lines = tiny_run.stdout.strip().splitlines()
    assert len(lines) == 1, tiny_run.stdout[-2000:]
    result = json.loads(lines[0])
    assert tiny_run.returncode == (0 if result["ok"] else 1), tiny_run.stderr[-3000:]
    _check_stages(result)
    stages = result["stages"]
    assert all("skipped" not in stages[n] for n in STAGE_NAMES if n != "request_8b")  # all ran on tiny shapes
    assert stages["request_8b"]["skipped"].endswith("no CUDA")
    assert stages["models"]["figures"]["big"] == {"skipped": "no CUDA"}
    assert stages["facts"]["figures"]["limits"]["read_gbps"] > 0
    req = stages["request"]["figures"]
    assert req["prompt_tokens"] == 1500 and req["output_tokens"] == 32
    for key in ("ttft_ms", "prefill_ms", "decode_ms"):
        assert req["timeline"][key] > 0 and req["events"][key] > 0 and req["rel_diff"][key] is not None
    variants = stages["variants"]["figures"]["variants"]
    assert set(variants) == set(METHODS) - {stages["variants"]["figures"]["base_dtype"]}
    assert all({"step_ms", "refused", "skipped"} & set(v) for v in variants.values())
    assert "eager_step_ms" in stages["compiled"]["figures"] and stages["compiled"]["figures"]["info"]
    targets = result["targets"]
    for name in ("fp32_parity", "batch_equal_solo", "lookup_equal_greedy"):
        assert targets[name]["pass"] is True, (name, targets[name])
    # judged, not asserted true: a 0.5 s limits probe on a shared CPU can read a peak below what a
    # prefill then reaches (the GPU run probes for its full budget; the judging is tested with fed figures)
    assert targets["roofline_at_most_1"]["pass"] is not None and all(
        v is not None for v in targets["roofline_at_most_1"]["figures"].values())
    for name in ("bf16_8b_within_1.5x_hbm", "int4_at_least_1.8x_bf16", "graph_step_at_least_5x_eager"):
        assert targets[name]["pass"] is None and targets[name]["why"] == "speed targets are for a GPU"
    assert "verdict:" in tiny_run.stderr and "gpu-check: request:" in tiny_run.stderr  # progress on stderr


def test_the_budget_skips_stages_with_the_reason(capsys):
    from engine.bench import main

    code = main(["gpu", "--device", "cpu", "--shapes", "tiny", "--budget-s", "1"])
    out, err = capsys.readouterr()
    result = json.loads(out.strip())
    assert len(out.strip().splitlines()) == 1
    _check_stages(result)
    assert "time budget" in result["stages"]["facts"]["skipped"]
    assert result["stages"]["roofline"]["skipped"].startswith("no request ran")
    assert all(t["pass"] is None for t in result["targets"].values())  # nothing judged, nothing failed
    assert code == 0 and result["ok"] is True and "verdict: PASS" in err


def _gpu_figures(step_ms=9.0, hbm_ms=7.0, int4=2.0, graph=6.0, agree=True):
    fig = {"request": {"agree": agree, "rel_diff": {"ttft_ms": 0.01}},
           "parity": {"top1_agreement": 1.0, "max_logit_diff": 1e-4},
           "batch": {"all_equal": True, "equal": 8, "requests": 8},
           "lookup": {"equal": True, "speedup": 1.5},
           "roofline": {"all_at_most_1": True, "fractions": {"small.decode_bandwidth_fraction": 0.5}},
           "variants": {"base": "llama3-8b-shape", "base_step_ms": step_ms, "hbm_ms": hbm_ms,
                        "step_over_hbm": step_ms / hbm_ms, "variants": {"int4wo": {"speedup_vs_base": int4}}},
           "compiled": {"eager_step_ms": 6.0, "graph_step_ms": 6.0 / graph, "speedup": graph}}
    return {name: {"ok": True, "figures": f} for name, f in fig.items()}


def test_the_gpu_targets_are_judged_from_the_figures():
    passed = gpu.judge(_gpu_figures(), cuda=True)
    for name in ("bf16_8b_within_1.5x_hbm", "int4_at_least_1.8x_bf16", "graph_step_at_least_5x_eager",
                 "request_timeline_vs_events", "fp32_parity", "batch_equal_solo"):
        assert passed[name]["pass"] is True, name
    assert passed["request_8b_timeline_vs_events"]["pass"] is None  # its stage did not run: not judged
    failed = gpu.judge(_gpu_figures(step_ms=12.0, int4=1.5, graph=3.0, agree=False), cuda=True)
    for name in ("bf16_8b_within_1.5x_hbm", "int4_at_least_1.8x_bf16", "graph_step_at_least_5x_eager",
                 "request_timeline_vs_events"):
        assert failed[name]["pass"] is False, name
    on_cpu = gpu.judge(_gpu_figures(step_ms=12.0), cuda=False)
    assert on_cpu["bf16_8b_within_1.5x_hbm"]["pass"] is None and on_cpu["fp32_parity"]["pass"] is True
    small_only = _gpu_figures()
    small_only["variants"]["figures"]["base"] = "bundled-shape"  # no 8B: its targets are not judged
    assert gpu.judge(small_only, cuda=True)["int4_at_least_1.8x_bf16"]["why"] == "the 8B shape did not run"


def test_the_8b_stages_run_on_a_small_stand_in(monkeypatch, tokenizer, tmp_path):
    """The 8B shape's own code (its bf16 build, an untied head over a vocabulary larger than the
    tokenizer's, its request and its variants) run on a CPU at a small stand-in's sizes."""
    import torch

    from engine.bench import gpu_models as gm
    from engine.bench import gpu_stages as st

    monkeypatch.setattr(gm, "LLAMA3_8B", {**gm.LLAMA3_8B, **gm.TINY, "tie_word_embeddings": False})
    ctx = st.Context(device=torch.device("cpu"), tiny=True, cache_dir=tmp_path, prompt_tokens=48, new_tokens=4)
    ctx.tokenizer = tokenizer
    base = gm.bundled_config()
    built = st.build_big(ctx, base)
    assert ctx.big.name == "llama3-8b-shape" and ctx.big.dtype == torch.bfloat16 and built["layers"] == 2
    assert ctx.big.model.vocab_size == 128256 and ctx.big.model.lm_head.weight is not ctx.big.model.embed.weight
    req = st.request(ctx, "big")
    assert req["output_tokens"] == 4 and req["prompt_tokens"] == 48 and ctx.requests["big"] is req
    out = st.variants(ctx, lambda: 1e9)
    assert out["base"] == "llama3-8b-shape" and out["base_dtype"] == "bf16" and out["base_step_ms"] > 0
    assert "bf16" not in out["variants"] and list(out["variants"])[:3] == list(st.FIRST_VARIANTS)
    assert all({"step_ms", "refused"} & set(v) for v in out["variants"].values())
    assert gm.param_bytes(gm.shaped(base, **gm.LLAMA3_8B), torch.bfloat16) == ctx.big.weight_bytes()


def test_the_reports_gpu_row_gives_the_verdict_and_each_target():
    from engine.bench import report_render

    stages = _gpu_figures(int4=1.5)
    stages["facts"] = {"ok": True, "figures": {"device_name": "NVIDIA H200", "limits": {"read_gbps": 4100.0}}}
    result = {"device": "cuda", "targets": gpu.judge(stages, cuda=True), "stages": stages, "ok": False}
    line = report_render.step_line({"name": "gpu", "result": result})
    assert line.startswith("NVIDIA H200: verdict **FAIL**; read 4,100.0 GB/s")
    assert "int4_at_least_1.8x_bf16 **FAIL**" in line and "fp32_parity pass" in line
    assert "request_8b_timeline_vs_events —" in line


def test_the_cuda_event_clock_records_events_and_reads_them_after_a_sync(monkeypatch):
    """EventClock's CUDA branch (fed a fake Event): a mark records an event on the stream; ms()
    waits on the end event, then asks the start event for the elapsed time."""
    import torch

    from engine.bench import gpu_models as gm

    log = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = len(log) * 10.0
            log.append("record")

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    clock = gm.EventClock(torch.device("cuda"))
    clock.mark("a")
    clock.mark("b")
    assert clock.ms("a", "b") == 10.0 and log == ["record", "record", "sync"]
    assert clock.ms("a", "never") is None


def test_a_refused_compiled_step_is_a_skip_with_the_reason(tiny):
    from engine.bench import gpu_stages as st
    from engine.platform import capabilities

    ctx = st.Context(device=__import__("torch").device("cpu"), tiny=True, cache_dir=None, prompt_tokens=8,
                     new_tokens=2)
    with capabilities.forced(cpp_compiler=None):  # the plan made here refuses the compiled step, with why
        ctx.small = _fresh(tiny)
        with pytest.raises(st.Skip, match="C\\+\\+ compiler"):
            st.compiled(ctx)


def _fresh(loaded):
    """A LoadedModel over a copy of `loaded`'s module: a model object no runner was made for yet."""
    import copy

    fresh = copy.copy(loaded)
    fresh.model = copy.deepcopy(loaded.model)
    return fresh


def test_the_bundled_shape_is_the_ggufs_and_the_tokenizer_travels_as_a_folder(tmp_path, tokenizer):
    """The check builds the bundled architecture from a constant (a bare GPU image cannot read the
    GGUF): it must be the GGUF's config. Its tokenizer is saved with --save-tokenizer and read back
    with --tokenizer where the bundled package is missing."""
    from transformers import AutoConfig

    from engine.bench import gpu_models as gm
    from engine.bench import main
    from engine.model.loader import _quiet, bundled_gguf_path

    gguf = bundled_gguf_path()
    with _quiet():
        want = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).to_dict()
    got = gm.bundled_config().to_dict()
    for key in gm.BUNDLED_SHAPE:
        assert got[key] == want[key], key
    assert main(["gpu", "--save-tokenizer", str(tmp_path / "tok")]) == 0
    saved = gm.bundled_tokenizer(str(tmp_path / "tok"))
    assert saved.get_vocab() == tokenizer.get_vocab() and saved.chat_template == tokenizer.chat_template


def test_without_the_bundled_package_the_tokenizer_comes_from_the_cache_or_an_error_says_how(
        monkeypatch, tmp_path, bundled):
    from engine.bench import gpu_models as gm
    from engine.core.errors import LoadError
    from engine.model import loader

    def missing():
        raise LoadError("the bundled model is not installed")

    monkeypatch.setattr(loader, "bundled_gguf_path", missing)
    found = gm.bundled_tokenizer(None, bundled.cache_dir)  # the loader's converted copy
    assert found.get_vocab() == bundled.tokenizer.get_vocab()
    with pytest.raises(LoadError, match="--save-tokenizer DIR"):
        gm.bundled_tokenizer(None, tmp_path)
