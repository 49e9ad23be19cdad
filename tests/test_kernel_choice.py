"""The one kernel decision (engine/kernels/choose.py), its per-machine cache (engine/kernels/plan.py),
one switch per kernel (engine/kernels/switches.py), and the one forward (engine/model/forward.py):
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
from engine.kernels import choose, cpu_attention, cpu_gemm, cpu_layers, switches
from engine.kernels import plan as kernel_plan
from engine.kernels.choose import Kernel, Plan
from engine.platform import capabilities
from engine.model.forward import forward

ROOT = Path(__file__).resolve().parents[1]
CAPS = capabilities.detect()

_CHILD = r"""
import json, sys, torch
from engine.core.config import LoadConfig
from engine.model.loader import load
lm = load(LoadConfig(model=sys.argv[1], dtype="fp32", progress=False, cache_dir=sys.argv[2]))
m = lm.model
cache = m.new_cache(64)
logits = m.forward(torch.arange(100, 120), cache, all_logits=True)
steps, ids = [logits], []
for _ in range(8):
    ids.append(int(steps[-1][-1].argmax()))
    steps.append(m.forward(torch.tensor(ids[-1:]), cache))
torch.save([s.clone() for s in steps], sys.argv[3])
print(json.dumps({"ids": ids, "plan": m.kernel_plan.one_row, "source": m.kernel_plan.source}))
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


def test_the_table_follows_rows_and_plan():
    lin = nn.Linear(64, 96)
    ours = Plan(one_row="ours")
    if cpu_gemm.available():
        assert choose.choose(lin, 1, ours) is Kernel.OURS_FP32
        assert choose.choose(lin, choose.OURS_ROWS, ours) is Kernel.OURS_FP32
    assert choose.choose(lin, choose.OURS_ROWS + 1, ours) is Kernel.ATEN  # a long prefill: MKL
    assert choose.choose(lin, 1, Plan(one_row="gemv")) is Kernel.ATEN
    if CAPS.packed_fp32_weights:
        assert choose.choose(lin, 1, Plan(one_row="packed")) is Kernel.ONEDNN_PACKED
        assert choose.choose(lin, 2, Plan(one_row="gemv")) is Kernel.ONEDNN_PACKED
    assert choose.per_sequence(Kernel.ATEN, lin) and not choose.per_sequence(Kernel.ONEDNN_PACKED, lin)
    assert not choose.per_sequence(Kernel.ATEN, lin.to(torch.bfloat16))  # no exactness promise in bf16
    with pytest.raises(ValueError):
        kernel_plan.inject(nn.Module(), "fastest")


@pytest.mark.parametrize("one_row", ["gemv", "packed", "ours"])
def test_a_sequence_gets_its_alone_bits_beside_any_other_under_every_plan(tiny, one_row):
    """A decode row, a short prompt and a long one (past OURS_ROWS and PACKED_FP32_MAX: MKL, not
    row-invariant, so called per sequence) in one forward: each sequence's logits are its alone bits."""
    if one_row == "ours" and not cpu_gemm.available() or one_row == "packed" and not CAPS.packed_fp32_weights:
        pytest.skip(f"{one_row} does not run here")
    model, saved = tiny.model, tiny.model.kernel_plan
    try:
        kernel_plan.inject(model, one_row)
        prompts = [list(range(3, 11)), [7], list(range(20, 20 + choose.OURS_ROWS + 3)), [9]]
        alone = []
        for p in prompts:
            cache = model.new_cache(300)
            forward(model, [[1, 2]], [cache])  # a prefix, so the 1-token rows are decode rows
            alone.append(forward(model, [p], [cache]))
        caches = [model.new_cache(300) for _ in prompts]
        for c in caches:
            forward(model, [[1, 2]], [c])
        together = forward(model, prompts, caches)
        assert all(torch.equal(together[b : b + 1], alone[b]) for b in range(len(prompts)))
    finally:
        model.kernel_plan = saved
        choose.prepare(model)


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
    want = choose.used(bundled.model, 1)
    assert info["decode"] == want and info["prefill"] == choose.used(bundled.model, 64)
    assert info["one_row"]["choice"] == bundled.model.kernel_plan.one_row
    assert set(info["switches"]) == set(switches.SWITCHES)
    assert set(want.split("+")) <= set(info["names"])
    done = bundled_engine.complete([{"role": "user", "content": "Hi."}],
                                   GenerationConfig(temperature=0.0, max_new_tokens=3))
    kernels = done.timeline.counters["kernels"]
    assert kernels == {"prefill": choose.used(bundled.model, done.timeline.prefill_tokens), "decode": want}
    assert done.timeline.to_dict()["kernels"] == kernels
