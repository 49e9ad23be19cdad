"""Which device serves, and why (engine/platform/device.py): every case told apart from faked CUDA facts."""

import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

from engine.core.errors import LoadError
from engine.core.info import EngineInfo
from engine.platform import device
from engine.platform.device import CudaFacts, choose

SUITE_DEVICE = os.environ.get(device.ENV)  # as tests/conftest.py left it, before this file's fixture clears it
CPU_ONLY = CudaFacts(torch_cuda=None, available=False)
H200 = CudaFacts(torch_cuda="13.0", available=True, nvidia_smi=True, driver="580.65.06", driver_cuda="13.0",
                 gpu="NVIDIA H200", capability=(9, 0))


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(device.ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_usable_gpu_serves_and_is_named():
    chosen = choose("auto", H200)
    assert chosen.device == torch.device("cuda")
    assert chosen.reason == "cuda:0 (NVIDIA H200, sm90, CUDA 13.0, driver 580.65.06)"


def test_cpu_only_torch_says_so_and_what_to_install():
    chosen = choose("auto", CPU_ONLY)
    assert chosen.device == torch.device("cpu")
    assert chosen.reason.startswith("cpu: this torch") and "CPU-only build (torch.version.cuda is None)" in chosen.reason
    assert "no `nvidia-smi`" in chosen.reason
    with_driver = choose("auto", CudaFacts(torch_cuda=None, available=False, nvidia_smi=True)).reason
    assert "install a CUDA build of torch to use the GPU" in with_driver


def test_a_driver_too_old_for_torchs_cuda_is_named_from_torchs_warning_or_nvidia_smi():
    warned = CudaFacts(torch_cuda="13.0", available=False, nvidia_smi=True,
                       torch_warning="CUDA initialization: The NVIDIA driver on your system is too old (found version 12040).")
    reason = choose("auto", warned).reason
    assert reason.startswith("cpu: torch is built for CUDA 13.0, but the NVIDIA driver is too old")
    assert "found version 12040" in reason and "update the driver" in reason
    silent = CudaFacts(torch_cuda="13.0", available=False, nvidia_smi=True, driver="550.54", driver_cuda="12.4")
    reason = choose("auto", silent).reason
    assert "too old" in reason and "driver 550.54 supports CUDA 12.4" in reason
    newer = CudaFacts(torch_cuda="12.8", available=False, nvidia_smi=True, driver="580.1", driver_cuda="13.0")
    assert "too old" not in choose("auto", newer).reason  # a newer driver is fine: something else is wrong
    assert "sees no usable GPU" in choose("auto", newer).reason


def test_no_driver_and_hidden_gpus_are_told_apart():
    none = choose("auto", CudaFacts(torch_cuda="13.0", available=False)).reason
    assert "no NVIDIA driver is installed (no `nvidia-smi` on PATH)" in none
    hidden = choose("auto", CudaFacts(torch_cuda="13.0", available=False, nvidia_smi=True, visible_devices="")).reason
    assert "CUDA_VISIBLE_DEVICES=''" in hidden


def test_asked_for_devices():
    assert choose("cpu", H200).reason == "cpu: --device cpu asked for"
    assert choose("cuda", H200).device.type == "cuda"
    with pytest.raises(LoadError, match=r"--device cuda was asked for, but torch is built for CUDA 13.0.*too old.*"
                                        r"use --device cpu"):
        choose("cuda", CudaFacts(torch_cuda="13.0", available=False, nvidia_smi=True, driver_cuda="12.2"))


def test_the_environment_sets_what_auto_means(monkeypatch):
    monkeypatch.setenv(device.ENV, "cpu")
    assert choose("auto", H200).reason == "cpu: $LATENCY_LAB_DEVICE=cpu asked for"
    assert choose("cuda", H200).device.type == "cuda"  # an explicit flag still wins
    monkeypatch.setenv(device.ENV, "tpu")
    with pytest.raises(LoadError, match="LATENCY_LAB_DEVICE must be cpu or cuda"):
        choose("auto", H200)


def test_cuda_facts_read_torchs_warning_and_nvidia_smi(monkeypatch):
    def is_available():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version 12020).")
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(device.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    header = "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |"
    monkeypatch.setattr(device.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout=header))
    facts = device.cuda_facts()
    assert facts.torch_cuda == "13.0" and not facts.available and facts.nvidia_smi
    assert facts.driver == "535.104.05" and facts.driver_cuda == "12.2"
    assert "too old (found version 12020)" in facts.torch_warning
    assert "driver 535.104.05 supports CUDA 12.2" in choose("auto", facts).reason


def test_the_header_and_start_line_carry_the_reason():
    from server.cli import device_line

    info = EngineInfo(name="m", source="bundled", dtype="bf16", device="cpu",
                      device_reason="cpu: this torch is a CPU-only build")
    assert "bf16 · cpu: this torch is a CPU-only build" in info.headline()
    assert EngineInfo.from_dict(info.to_dict()).device_reason == info.device_reason
    engine = types.SimpleNamespace(loaded=types.SimpleNamespace(device_reason="cuda:0 (NVIDIA H200)"))
    assert device_line({"m": engine, "remote": object()}) == "device: cuda:0 (NVIDIA H200)"
    assert device_line({"remote": object()}) is None


def test_the_command_prints_the_choice():
    r = subprocess.run([sys.executable, "-m", "engine.platform.device"], check=False, capture_output=True, text=True, timeout=120,
                       env={**os.environ, device.ENV: "cpu"})
    assert r.returncode == 0 and r.stdout.strip() == "cpu: $LATENCY_LAB_DEVICE=cpu asked for"


def test_the_bundled_engine_reports_its_device_through_the_api(bundled_engine):
    from openai import OpenAI
    from support import served

    with served(bundled_engine) as (url, _, name):
        card = OpenAI(base_url=url + "/v1", api_key="unused").models.retrieve(name)
    info = card.model_extra["latency_lab"]
    assert info["device"] == "cpu" and info["device_reason"] == "cpu: --device cpu asked for"
    assert "cpu: --device cpu asked for" in EngineInfo.from_dict(info).headline()


def test_the_suite_pins_auto_to_cpu_even_where_torch_sees_a_gpu(tiny_model_dir, monkeypatch):
    """tests/conftest.py sets $LATENCY_LAB_DEVICE=cpu (subprocesses inherit it), so on a GPU host the
    tests' `auto` loads still run on CPU, where their bit-exactness assertions hold."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    assert SUITE_DEVICE == "cpu"
    monkeypatch.setenv(device.ENV, SUITE_DEVICE)  # undo this file's fixture
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU host, as far as torch says
    lm = load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
    assert lm.device.type == "cpu" and lm.device_reason == "cpu: $LATENCY_LAB_DEVICE=cpu asked for"
