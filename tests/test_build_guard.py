"""A kernel build killed midway must not hang every later start (engine/kernels/build_guard.py).

Each test runs a real second process that holds the build folder as a build does (our OS lock, and
torch's `lock` file that `cpp_extension.load` creates), then dies or finishes; no compiler runs."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.kernels import build_guard, cpu_gemm

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for a build: hold the folder, create torch's lock, say so, then sleep (to be killed) or
# finish after `hold` seconds, removing the lock as torch does at the end of a build.
BUILDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from engine.kernels import build_guard
    folder, hold = Path(sys.argv[1]), float(sys.argv[2])
    with build_guard.exclusive_build(folder):
        lock = folder / build_guard.TORCH_LOCK
        lock.touch()
        print("building", flush=True)
        time.sleep(hold)
        print("lock still there at the end:", lock.exists(), flush=True)
        lock.unlink()
""")


def start_builder(folder: Path, hold: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(folder), str(hold)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "building"
    return proc


def test_a_lock_left_by_a_killed_build_is_removed_with_a_warning(tmp_path, caplog):
    proc = start_builder(tmp_path, hold=600)
    proc.kill()  # SIGKILL: no cleanup runs, as when a terminal closes mid-build
    proc.wait()
    assert (tmp_path / build_guard.TORCH_LOCK).exists()  # what used to hang every later start
    with caplog.at_level(logging.WARNING, logger=build_guard.__name__):
        with build_guard.exclusive_build(tmp_path):
            assert not (tmp_path / build_guard.TORCH_LOCK).exists()
    assert "was interrupted" in caplog.text


def test_a_live_build_is_waited_for_and_its_lock_left_alone(tmp_path, caplog):
    proc = start_builder(tmp_path, hold=1.0)
    with caplog.at_level(logging.WARNING, logger=build_guard.__name__):
        with build_guard.exclusive_build(tmp_path):
            assert not (tmp_path / build_guard.TORCH_LOCK).exists()  # in only once the builder had done
    out = proc.stdout.read()
    proc.wait()
    assert f"pid {proc.pid}" in caplog.text and "waiting for another process" in caplog.text
    assert "lock still there at the end: True" in out  # nobody removed a live build's lock
    assert "was interrupted" not in caplog.text


def test_a_clean_folder_builds_without_a_word(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=build_guard.__name__):
        with build_guard.exclusive_build(tmp_path / "new"):
            pass
    assert caplog.text == ""


def test_a_build_that_takes_long_says_it_is_compiling(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=build_guard.__name__):
        with build_guard.exclusive_build(tmp_path, slow_s=0.05):
            time.sleep(0.5)  # ten times the notice's delay: a compile, for this test
    assert "compiling our C++ kernels into" in caplog.text


def test_the_extension_build_goes_through_the_guard(tmp_path, monkeypatch):
    """cpu_gemm's build clears a stale lock in torch's folder for it before torch looks there."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = tmp_path / "latency_lab_gemv"
    folder.mkdir()
    (folder / build_guard.TORCH_LOCK).touch()
    seen = {}

    def load(**kwargs):
        seen.update(kwargs, lock=(Path(kwargs["build_directory"]) / build_guard.TORCH_LOCK).exists())
        raise RuntimeError("stop here: no compiler in this test")

    monkeypatch.setattr(cpp_extension, "load", load)
    reason = cpu_gemm._build.__wrapped__()  # the build itself, past its cache
    if not seen:  # a CPU or toolchain this extension does not build on: nothing to guard
        pytest.skip(f"the build stops before torch's load here: {reason}")
    assert seen["build_directory"] == str(folder) and seen["lock"] is False
    assert "stop here" in reason
