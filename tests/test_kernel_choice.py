"""The one kernel decision (engine/runtime/plan.py), kept per machine (engine/platform/decisions.py),
one switch per kernel (engine/kernels/switches.py), and the one forward (engine/runtime/runner.py):
a restart gives the same bits, a sequence gets its own kernels whoever shares the forward, and
engine info and each reply say which kernels served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.core.config import GenerationConfig
from engine.bench import runner_for
from engine.kernels import cpu_attention, cpu_gemm, cpu_layers, switches
from engine.kernels.catalogue import Kernel
from engine.platform import capabilities
from engine.runtime import plan as kernel_plan
from engine.runtime.plan import make_plan
from engine.runtime.runner import Batch, Runner

ROOT = Path(__file__).resolve().parents[1]
CAPS = capabilities.detect()

_CHILD = r"""
import json, sys, torch
from engine.core.config import LoadConfig
from engine.model.loader import load
from engine.runtime.runner import open_runner
lm = load(LoadConfig(model=sys.argv[1], dtype="fp32", progress=False, cache_dir=sys.argv[2]))
m = open_runner(lm)
cache = m.new_cache(64)
logits = m.forward(torch.arange(100, 120), cache, all_logits=True)
steps, ids = [logits], []
for _ in range(8):
    ids.append(int(steps[-1][-1].argmax()))
    steps.append(m.forward(torch.tensor(ids[-1:]), cache))
torch.save([s.clone() for s in steps], sys.argv[3])
d = m.plan.decision("fp32 one-row")
print(json.dumps({"ids": ids, "plan": d.choice, "source": d.source}))
"""


def _child(model_dir, cache_dir, out, env=None) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(model_dir), str(cache_dir), str(out)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("gemm", ["on", "off"])
def test_two_fresh_processes_give_the_same_greedy_tokens_and_logits(tiny_model_dir, tmp_path, gemm):
    """Where our kernel builds, both processes take it by rule. Without it (LATENCY_LAB_GEMM=off, as on
    a CPU where it does not build) the first process measures GEMV against the packed copy and caches
    the winner; the second reads it. Either way: the same kernels, so the same token ids and
    bit-identical logits at every step."""
    env = {"LATENCY_LAB_GEMM": gemm}
    first = _child(tiny_model_dir, tmp_path / "cache", tmp_path / "a.pt", env)
    second = _child(tiny_model_dir, tmp_path / "cache", tmp_path / "b.pt", env)
    if gemm == "on" and cpu_gemm.available():
        assert first["plan"] == "ours" and first["source"].startswith("rule") and second["source"] == first["source"]
        assert not (tmp_path / "cache" / "kernel-plans").exists()  # nothing measured, nothing cached
    elif CAPS.packed_fp32_weights:  # there is a choice to make, measure and cache
        assert first["source"] == "measured" and second["source"].startswith("cached")
        assert len(list((tmp_path / "cache" / "kernel-plans").iterdir())) == 1
    assert second["plan"] == first["plan"] and second["ids"] == first["ids"]
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert len(a) == len(b) == 9 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_table_follows_rows_and_plan(tiny):
    model = tiny.model
    ours = make_plan(model, one_row="ours").linears["qkv"]
    if cpu_gemm.available():
        assert ours.kernel(1) is Kernel.OURS_FP32
        assert ours.kernel(kernel_plan.OURS_ROWS) is Kernel.OURS_FP32
    assert ours.kernel(kernel_plan.OURS_ROWS + 1) is Kernel.ATEN  # a long prefill: MKL
    gemv = make_plan(model, one_row="gemv").linears["qkv"]
    assert gemv.kernel(1) is Kernel.ATEN
    if CAPS.packed_fp32_weights:
        assert make_plan(model, one_row="packed").linears["qkv"].kernel(1) is Kernel.ONEDNN_PACKED
        assert gemv.kernel(2) is Kernel.ONEDNN_PACKED
    assert gemv.per_sequence(Kernel.ATEN) and not gemv.per_sequence(Kernel.ONEDNN_PACKED)
    bf16 = kernel_plan._linear_plan(nn.Linear(8, 8).to(torch.bfloat16), "cpu", CAPS, None, None, False)
    assert not bf16.per_sequence(Kernel.ATEN)  # no exactness promise in bf16
    with pytest.raises(ValueError):
        make_plan(model, one_row="fastest")


@pytest.mark.parametrize("one_row", ["gemv", "packed", "ours"])
def test_a_sequence_gets_its_alone_bits_beside_any_other_under_every_plan(tiny, one_row):
    """A decode row, a short prompt and a long one (past OURS_ROWS and PACKED_FP32_MAX: MKL, not
    row-invariant, so called per sequence) in one forward: each sequence's logits are its alone bits."""
    if one_row == "ours" and not cpu_gemm.available() or one_row == "packed" and not CAPS.packed_fp32_weights:
        pytest.skip(f"{one_row} does not run here")
    runner = Runner(tiny.model, make_plan(tiny.model, one_row=one_row))
    prompts = [list(range(3, 11)), [7], list(range(20, 20 + kernel_plan.OURS_ROWS + 3)), [9]]
    alone = []
    for p in prompts:
        cache = runner.new_cache(300)
        runner.run(Batch([[1, 2]], [cache]))  # a prefix, so the 1-token rows are decode rows
        alone.append(runner.run(Batch([p], [cache])))
    caches = [runner.new_cache(300) for _ in prompts]
    for c in caches:
        runner.run(Batch([[1, 2]], [c]))
    together = runner.run(Batch(prompts, caches))
    assert all(torch.equal(together[b : b + 1], alone[b]) for b in range(len(prompts)))


def test_one_switch_per_kernel_and_the_old_one_turns_all_off(monkeypatch):
    for name, (var, _) in switches.SWITCHES.items():
        monkeypatch.setenv(var, "off")
        assert switches.off_reason(name) == f"turned off ({var}=off)"
        assert all(switches.off_reason(o) is None for o in switches.SWITCHES if o != name)  # only its own
        monkeypatch.delenv(var)
    monkeypatch.setenv("LATENCY_LAB_ATTENTION", "off")
    assert "LATENCY_LAB_ATTENTION" in cpu_attention.unavailable_reason()
    assert cpu_gemm.unavailable_reason() == cpu_gemm.built_reason()  # the products keep our kernel
    monkeypatch.delenv("LATENCY_LAB_ATTENTION")
    monkeypatch.setenv(switches.ALL_OFF, "off")
    assert all(switches.off_reason(n) == f"turned off ({switches.ALL_OFF}=off)" for n in switches.SWITCHES)
    assert cpu_gemm.unavailable_reason() and cpu_attention.unavailable_reason() and cpu_layers.unavailable_reason()
    monkeypatch.delenv(switches.ALL_OFF)
    with switches.forced_off("layers"):
        assert "forced_off" in switches.off_reason("layers") and switches.off_reason("gemm") is None
    assert switches.off_reason("layers") is None
    with pytest.raises(ValueError), switches.forced_off("gemv"):
        pass


def test_engine_info_and_each_reply_say_which_kernels_served(bundled_engine, bundled):
    info = bundled_engine.info().kernels
    plan = runner_for(bundled).plan
    want = plan.used(1)
    assert info["decode"] == want and info["prefill"] == plan.used(64)
    assert info["one_row"]["choice"] == plan.one_row
    assert set(info["switches"]) == set(switches.SWITCHES)
    assert set(want.split("+")) <= set(info["names"])
    done = bundled_engine.complete([{"role": "user", "content": "Hi."}],
                                   GenerationConfig(temperature=0.0, max_new_tokens=3))
    kernels = done.timeline.counters.kernels
    assert kernels == {"prefill": plan.used(done.timeline.prefill_tokens), "decode": want}
    assert done.timeline.to_dict()["kernels"] == kernels
