"""The wheel `pip install .` builds holds everything the installed code runs with: every package,
the C++ kernel sources (built at first use), the page's scripts, the bundled draft and the prompt
sets, the LICENSE and the console scripts. Built from a copy of the checkout, so the build's own
leftovers (build/, *.egg-info) stay out of it. A fresh-venv install is not run here (minutes): the
README's packaging line says how it was checked."""

from __future__ import annotations

import configparser
import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("engine", "server", "ui")
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "requirements.txt", "app.py", *PACKAGE_DIRS)
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORE)
        else:
            shutil.copy2(path, src / name)
    # --no-build-isolation: the venv's setuptools (no index needed); --no-deps: only our wheel
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = list(out.glob("latency_lab-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        yield zf


def _checkout_files() -> set[str]:
    """Every file in the package folders, as the wheel names it (what `git add` would ship)."""
    files = {"app.py"}
    for top in PACKAGE_DIRS:
        for path in (ROOT / top).rglob("*"):
            rel = path.relative_to(ROOT)
            if path.is_file() and not any(part == "__pycache__" or part.startswith(".") for part in rel.parts) \
                    and path.suffix != ".pyc":
                files.add(rel.as_posix())
    return files


def test_wheel_holds_every_file_of_the_packages(wheel):
    names = set(wheel.namelist())
    missing = sorted(_checkout_files() - names)
    assert not missing, f"not in the wheel (pyproject.toml: packages.find / package-data): {missing}"


def test_wheel_holds_what_the_code_reads_at_run_time(wheel):
    names = set(wheel.namelist())
    needed = {
        # every package, found rather than listed (a new subpackage ships without an edit)
        *(f"{pkg}/__init__.py" for pkg in ("engine", "engine/bench", "engine/core", "engine/kernels",
                                            "engine/measure", "engine/model", "engine/quant", "engine/remote",
                                            "engine/serving", "engine/speculative", "server", "server/bench", "ui")),
        "engine/__main__.py", "server/__main__.py",
        # the C++ kernels' sources (engine/kernels/cpu_gemm.py builds them at first use)
        "engine/kernels/cpu_gemm.cpp", "engine/kernels/cpu_attention.cpp", "engine/kernels/cpu_layers.cpp",
        # the bundled draft (engine/speculative/draft.py) and the prompt sets (ui/shell/presets.py)
        "engine/assets/draft-smollm2-135m/draft.json", "engine/assets/draft-smollm2-135m/draft.safetensors",
        "ui/shell/prompts/copy_edits.json", "ui/shell/prompts/long_history.json", "ui/shell/prompts/open_questions.json",
        # the page's own scripts and style (ui/page.py)
        "ui/entry.js", "ui/chat/run.js", "ui/shell/page.css", "ui/chat/markdown.js", "ui/shell/config.js",
    }
    assert not sorted(needed - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith(("tests/", "build/"))]
    # the safetensors arrived whole, not as a pointer or an empty file
    source = ROOT / "engine/assets/draft-smollm2-135m/draft.safetensors"
    assert wheel.getinfo("engine/assets/draft-smollm2-135m/draft.safetensors").file_size == source.stat().st_size


def test_wheel_metadata_license_pins_and_commands(wheel):
    dist_info = next(n.split("/")[0] for n in wheel.namelist() if n.split("/")[0].endswith(".dist-info"))
    metadata = wheel.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Apache License" in wheel.read(f"{dist_info}/licenses/LICENSE").decode()
    # the pins of requirements.txt, as measured (torch pinned: unpinned, pip takes a CUDA build)
    assert "Requires-Dist: torch==2.13.0" in metadata
    entry_points = configparser.ConfigParser()
    entry_points.read_string(wheel.read(f"{dist_info}/entry_points.txt").decode())
    scripts = dict(entry_points["console_scripts"])
    assert set(scripts) == {"latency-lab", "latency-lab-cli", "latency-lab-server"}
    for target in scripts.values():  # each names a callable that exists
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), target
