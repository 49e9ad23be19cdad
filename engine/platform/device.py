"""Which device serves, and why, in one sentence (`choose`): the start line, engine info and the page
header show it, so a user with a GPU is told plainly when the engine serves on CPU instead.

Why it needs more than `torch.cuda.is_available()`: the public index's torch (`make run` pins one) is
a CUDA build for one CUDA major version; with an older NVIDIA driver `is_available()` is just False,
and the only trace is a warning torch prints once ("The NVIDIA driver on your system is too old").
So where torch sees no GPU, `choose` tells the cases apart from what torch and the system say:
a CPU-only torch (`torch.version.cuda` is None), GPUs hidden by CUDA_VISIBLE_DEVICES, no NVIDIA
driver (`nvidia-smi` is not on PATH), a driver older than torch's CUDA (torch's warning, or
`nvidia-smi`'s "CUDA Version" below torch's), or none of these (torch's own words, when it said any).

`auto` means $LATENCY_LAB_DEVICE where that is set (the test suite pins `cpu` with it, so a GPU host
runs the CPU-exact tests on CPU: tests/conftest.py), else the GPU where torch can use one, else CPU.
`--device cuda` without a usable GPU is a LoadError that carries the same reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass

import torch

from engine.core.errors import LoadError

ENV = "LATENCY_LAB_DEVICE"  # what `auto` means where it is set: cpu or cuda


@dataclass(frozen=True)
class DeviceChoice:
    device: torch.device
    reason: str  # 'cuda:0 (NVIDIA H200, …)' or 'cpu: this torch is a CPU-only build …'

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class CudaFacts:
    """What torch and the system say about CUDA here (`cuda_facts`; tests build one by hand)."""

    torch_cuda: str | None  # torch.version.cuda: the CUDA torch was built for (None: a CPU-only build)
    available: bool  # torch.cuda.is_available()
    torch_warning: str | None = None  # what torch warned while looking for a GPU (e.g. the driver is too old)
    visible_devices: str | None = None  # $CUDA_VISIBLE_DEVICES as set (None: unset)
    nvidia_smi: bool = False  # `nvidia-smi` is on PATH (an NVIDIA driver is installed)
    driver: str | None = None  # the driver version nvidia-smi reports
    driver_cuda: str | None = None  # the newest CUDA that driver supports (nvidia-smi's "CUDA Version")
    gpu: str | None = None  # torch's name for device 0, where available
    capability: tuple[int, int] | None = None


def cuda_facts() -> CudaFacts:
    with warnings.catch_warnings(record=True) as caught:  # torch warns once, at its first look
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    said = "; ".join(str(w.message).strip() for w in caught if "cuda" in str(w.message).lower()) or None
    smi = shutil.which("nvidia-smi")
    driver, driver_cuda = _nvidia_smi(smi) if smi else (None, None)
    gpu = cap = None
    if available:
        gpu, cap = torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))
    return CudaFacts(torch_cuda=torch.version.cuda, available=available, torch_warning=said,
                     visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), nvidia_smi=bool(smi),
                     driver=driver, driver_cuda=driver_cuda, gpu=gpu, capability=cap)


def _nvidia_smi(path: str) -> tuple[str | None, str | None]:
    """(driver version, its CUDA version) from nvidia-smi's header; (None, None) if it does not answer."""
    try:
        out = subprocess.run([path], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    driver = re.search(r"Driver Version:\s*([\d.]+)", out)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return (driver.group(1) if driver else None), (cuda.group(1) if cuda else None)


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:2])


def gpu_description(facts: CudaFacts) -> str:
    """'cuda:0 (NVIDIA H200, sm90, CUDA 13.0, driver 580.65)'."""
    parts = [facts.gpu or "GPU"]
    if facts.capability:
        parts.append("sm" + "".join(map(str, facts.capability)))
    parts.append(f"CUDA {facts.torch_cuda}")
    if facts.driver:
        parts.append(f"driver {facts.driver}")
    return f"cuda:0 ({', '.join(parts)})"


def why_no_gpu(facts: CudaFacts) -> str:
    """Why torch serves no GPU here, and what to do about it (facts.available is False)."""
    if facts.torch_cuda is None:
        tail = ("; `nvidia-smi` finds an NVIDIA driver here: install a CUDA build of torch to use the GPU"
                if facts.nvidia_smi else " and no NVIDIA driver is installed (no `nvidia-smi` on PATH)")
        return f"this torch ({torch.__version__}) is a CPU-only build (torch.version.cuda is None){tail}"
    built = f"torch is built for CUDA {facts.torch_cuda}"
    if facts.visible_devices is not None and facts.visible_devices.strip() in ("", "-1", "none"):
        return f"{built}, but CUDA_VISIBLE_DEVICES={facts.visible_devices!r} hides every GPU"
    said = f" (torch says: {facts.torch_warning})" if facts.torch_warning else ""
    old = "too old" in (facts.torch_warning or "").lower() or (
        facts.driver_cuda is not None and _version(facts.driver_cuda) < _version(facts.torch_cuda))
    if old:
        have = f"driver {facts.driver or '?'} supports CUDA {facts.driver_cuda}" if facts.driver_cuda else \
            "the driver supports an older CUDA"
        return (f"{built}, but the NVIDIA driver is too old for it ({have}){said}; update the driver, or "
                f"install a torch built for the CUDA your driver supports")
    if not facts.nvidia_smi:
        return f"{built}, but sees no GPU: no NVIDIA driver is installed (no `nvidia-smi` on PATH){said}"
    return f"{built}, but sees no usable GPU (`nvidia-smi` reports driver {facts.driver or '?'}){said}"


def choose(name: str, facts: CudaFacts | None = None) -> DeviceChoice:
    """The device for `--device NAME` (auto | cpu | cuda) and why, e.g. DeviceChoice(cpu, 'cpu: --device cpu
    asked for'). Raises LoadError for cuda without a usable GPU."""
    asked = name
    if name == "auto" and os.environ.get(ENV):
        name = os.environ[ENV].strip().lower()
        if name not in ("cpu", "cuda"):
            raise LoadError(f"${ENV} must be cpu or cuda (or unset), not {os.environ[ENV]!r}")
    source = f"${ENV}={name}" if asked == "auto" else f"--device {name}"
    if name == "cpu":
        return DeviceChoice(torch.device("cpu"), f"cpu: {source} asked for")
    facts = facts or cuda_facts()
    if facts.available:
        return DeviceChoice(torch.device("cuda"), gpu_description(facts))  # torch's current device: 0 unless set
    if name == "cuda":
        raise LoadError(f"{source} was asked for, but {why_no_gpu(facts)}; use --device cpu")
    if name != "auto":
        raise LoadError(f"--device must be auto, cpu or cuda, not {name!r}")
    return DeviceChoice(torch.device("cpu"), f"cpu: {why_no_gpu(facts)}")


if __name__ == "__main__":  # `python -m engine.platform.device`: what `--device auto` picks here, and why
    print(choose("auto"))
