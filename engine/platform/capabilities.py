"""What this machine can do, detected once: CPU ISA, what torch/oneDNN support, CUDA, bitsandbytes.

Every fast path is chosen from `detect()` and has a fallback, so the same code is right on an
AVX2-only CPU, on AVX-512 (with or without BF16), AMX and CUDA. Tests force a fallback by
patching `detect` (see `forced`), never by assuming the machine they run on.

The ISA flags come from cpuid (torch's reader, `_isa_flags`), not /proc/cpuinfo: under an emulator
(qemu-user) /proc/cpuinfo is the host's, and a kernel chosen from it would die with an illegal
instruction; `scripts/qemu_cpu_classes.sh` runs the kernel tests under emulated smaller CPUs.

Why each flag matters here:
- `onednn_bf16`: oneDNN's bf16 GEMM and its packed-weight reorder
  (`torch.ops.mkldnn._reorder_linear_weight`) need AVX512BW/VL/DQ or AVX-NE-CONVERT; on an AVX2-only
  CPU the reorder raises "bf16 path needs the cpu support avx_ne_convert or avx512bw, ...".
- `native_bf16`: AVX512-BF16 or AMX dot products; without them bf16 arithmetic is emulated and
  fp32 is the faster default dtype.
- `int8_weight_only_kernel` / `int4_weight_only_kernel` / `cuda_int4_weight_only_kernel`: torch's own
  weight-only matmuls (engine/quant/quantize.py's int8wo / int4wo); a variant whose kernel is missing is
  refused before it is built.
- `cpp_compiler` / `triton`: what torch.compile generates code with (C++ on CPU, Triton on CUDA),
  needed by the compiled decode step (engine/runtime/compiled.py); without them the plan refuses it.
- `weight_only_activations`: the dtype those kernels get their activations in on CPU. "auto" lets
  engine/quant/quantize.py measure it once per process (on an AVX2-only CPU `_weight_int8pack_mm`
  with fp32 activations was several times slower than with bf16: docs/quantization.md); "bf16" or
  "model" (the model's own dtype, the fallback) force a choice.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field, replace

import torch

# /proc/cpuinfo flag names, grouped by what the engine cares about.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16",
             "avx512_vnni", "avx_vnni", "avx_ne_convert", "amx_tile", "amx_bf16", "amx_int8")
# The same flags as torch's cpuid reader names them (torch.cpu.get_capabilities(): pytorch/cpuinfo,
# which also checks that the OS saves the registers, XCR0); the rest are spelled alike.
_CPUID_NAMES = {"fma": "fma3", "avx512f": "avx512_f", "avx512bw": "avx512_bw", "avx512vl": "avx512_vl",
                "avx512dq": "avx512_dq"}


@dataclass(frozen=True)
class Capabilities:
    cpu_model: str
    isa: tuple[str, ...]  # the ISA_FLAGS the CPU that runs this code reports by cpuid (`_isa_flags`)
    torch_cpu_capability: str  # torch's own dispatch level: DEFAULT, AVX2, AVX512
    onednn: bool  # torch built with oneDNN (mkldnn)
    onednn_bf16: bool  # oneDNN can run bf16 GEMMs and pack bf16 weights
    native_bf16: bool  # AVX512-BF16 or AMX: bf16 dot products in hardware
    int8_weight_only_kernel: bool  # torch._weight_int8pack_mm exists
    int4_weight_only_kernel: bool  # torch._weight_int4pack_mm_for_cpu exists (CPU 4-bit weight-only)
    cuda: bool
    cuda_build: str | None = None  # torch.version.cuda: the CUDA this torch is built for (None: CPU-only)
    cuda_device: str | None = None
    cuda_capability: tuple[int, int] | None = None
    cuda_bf16: bool = False
    bitsandbytes: str | None = None  # its version, None if it does not import
    bnb_cpu_avx512bf16: bool = False  # its CPU 4-bit kernel's fast path (needs row counts % 32)
    bnb_unusable: str | None = None  # why bitsandbytes must not even be imported here (None: it may)
    cuda_int4_weight_only_kernel: bool = False  # torch._weight_int4pack_mm on this GPU (sm80+, bf16)
    weight_only_activations: str = "auto"  # CPU int8/int4 kernels' activation dtype: auto | bf16 | model
    cpp_compiler: str | None = None  # the C++ compiler torch.compile (Inductor) needs on CPU; None: none found
    triton: bool = False  # Triton imports: torch.compile's code generator on CUDA
    notes: tuple[str, ...] = field(default=())
    cpu_vendor: str = ""  # /proc/cpuinfo vendor_id: GenuineIntel, AuthenticAMD ("" where unknown)
    cpu_family: int | None = None  # its cpu family (AMD 25: Zen 3 and Zen 4; 26: Zen 5), None where unknown

    @property
    def packed_bf16_weights(self) -> bool:
        """Pre-packed oneDNN bf16 weights for multi-row matmuls (engine/kernels/catalogue.py packed_weight)."""
        return self.onednn and self.onednn_bf16

    @property
    def packed_fp32_weights(self) -> bool:
        """Pre-packed oneDNN fp32 weights for multi-row matmuls and batched steps (engine/kernels/catalogue.py
        packed_weight): oneDNN's fp32 kernels run on every x86 CPU torch runs on, so only the build decides."""
        return self.onednn

    @property
    def isa_level(self) -> str:
        """The short name people use: AMX, AVX-512 BF16, AVX-512, AVX2, or baseline x86-64/other."""
        have = set(self.isa)
        if {"amx_tile", "amx_bf16"} <= have:
            return "AMX"
        if "avx512_bf16" in have:
            return "AVX-512 BF16"
        if "avx512f" in have:
            return "AVX-512"
        if "avx2" in have:
            return "AVX2"
        return platform.machine() or "unknown"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["isa"] = list(self.isa)
        d["notes"] = list(self.notes)
        d["cuda_capability"] = list(self.cuda_capability) if self.cuda_capability else None
        d["packed_bf16_weights"] = self.packed_bf16_weights
        d["packed_fp32_weights"] = self.packed_fp32_weights
        d["isa_level"] = self.isa_level
        d["summary"] = self.summary()
        return d

    def summary(self) -> str:
        """One line: 'CPU model · ISA level · torch AVX2 · oneDNN bf16 no · CUDA none · bitsandbytes 0.50.2 ·
        compiler g++'."""
        parts = [self.cpu_model, self.isa_level, f"torch {self.torch_cpu_capability}",
                 f"oneDNN bf16 {'yes' if self.onednn_bf16 else 'no'}"]
        if self.cuda:
            parts.append(f"CUDA {self.cuda_device} sm{''.join(map(str, self.cuda_capability or ()))}")
        elif self.cuda_build:  # why: engine/platform/device.py, on the start line and in engine info
            parts.append(f"CUDA none usable (torch built for CUDA {self.cuda_build})")
        else:
            parts.append("CUDA none (CPU-only torch)")
        parts.append(f"bitsandbytes {self.bitsandbytes or 'missing'}")
        parts.append(f"compiler {os.path.basename(self.cpp_compiler) if self.cpp_compiler else 'none'}")
        return " · ".join(parts)


def _cpu_info() -> tuple[str, set[str], dict[str, str]]:
    """(the model's name, /proc/cpuinfo's flags, its vendor_id, cpu family and model where it has them)."""
    model, flags, ids = platform.processor() or platform.machine(), set(), {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("vendor_id", "cpu family", "model") and key not in ids:
                    ids[key] = value.strip()  # a hypervisor may hide the model name; these tell Zen 3 from Zen 5
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # not Linux: torch's own checks below still hold
        pass
    if "cpu family" in ids or "model" in ids:
        model += f" (family {ids.get('cpu family', '?')} model {ids.get('model', '?')})"
    return model, flags, ids


def _isa_flags(proc_flags: set[str]) -> tuple[set[str], str | None]:
    """The ISA_FLAGS of the CPU that runs this code, by cpuid (torch's own reader), and a note where
    /proc/cpuinfo says otherwise. /proc/cpuinfo is the kernel's view of the host: under qemu-user
    (`qemu-x86_64 -cpu Haswell`) it lists the host's AVX-512 while the emulated CPU has none, so a
    path chosen from it would die with an illegal instruction. Where torch has no cpuid reader (an
    older torch, not x86), /proc/cpuinfo's flags serve."""
    try:
        cpuid = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):
        return proc_flags, None
    flags = {f for f in ISA_FLAGS if cpuid.get(_CPUID_NAMES.get(f, f))}
    hidden = sorted((proc_flags & set(ISA_FLAGS)) - flags)
    note = None
    if hidden and proc_flags:
        note = (f"/proc/cpuinfo lists {', '.join(hidden)}, which the CPU that runs this code lacks by cpuid "
                "(an emulator such as qemu-user shows the host's flags there): the capabilities follow cpuid")
    return flags, note


def _onednn_bf16() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _native_bf16() -> bool:
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:
        return False


def _bitsandbytes_version() -> str | None:
    """Its installed version, found without importing it: importing it loads its native library,
    which on an x86 CPU without AVX2 kills the process with SIGILL (seen under `qemu-x86_64 -cpu
    Nehalem`: "Fatal Python error: Illegal instruction" in bitsandbytes/cextension.py)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return None
    try:
        return importlib.metadata.version("bitsandbytes")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _bitsandbytes_unusable(torch_cpu_capability: str, cuda: bool) -> str | None:
    """From torch's own cpuid check, not /proc/cpuinfo: an emulator or a VM may show the host's flags
    (qemu-user does) while the CPU that runs the code lacks them."""
    if platform.machine() in ("x86_64", "AMD64") and torch_cpu_capability == "DEFAULT" and not cuda:
        return ("bitsandbytes cannot run on this CPU: its native library needs AVX2, and loading it "
                "without AVX2 crashes the process (illegal instruction).")
    return None


@functools.lru_cache(maxsize=1)
def detect() -> Capabilities:
    model, proc_flags, ids = _cpu_info()
    flags, note = _isa_flags(proc_flags)
    cuda = torch.cuda.is_available()
    name = cap = None
    if cuda:
        name = torch.cuda.get_device_name(0)
        cap = tuple(torch.cuda.get_device_capability(0))
    bnb_version = _bitsandbytes_version()
    return Capabilities(
        cpu_model=model,
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
        onednn=torch.backends.mkldnn.is_available(),
        onednn_bf16=_onednn_bf16(),
        native_bf16=_native_bf16(),
        int8_weight_only_kernel=hasattr(torch, "_weight_int8pack_mm"),
        int4_weight_only_kernel=hasattr(torch, "_weight_int4pack_mm_for_cpu"),
        cuda=cuda,
        cuda_build=torch.version.cuda,
        cuda_device=name,
        cuda_capability=cap,
        cuda_bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        # torch's CUDA int4 kernel (tinygemm) is built for sm80+ and takes bf16 activations only
        cuda_int4_weight_only_kernel=bool(cuda and hasattr(torch, "_weight_int4pack_mm") and cap >= (8, 0)),
        bitsandbytes=bnb_version,
        cpp_compiler=shutil.which(os.environ.get("CXX") or "g++"),  # what Inductor calls on CPU
        triton=bool(cuda and importlib.util.find_spec("triton")),
        bnb_cpu_avx512bf16="avx512_bf16" in flags,  # bitsandbytes' has_avx512bf16() asks the CPU too
        bnb_unusable=(_bitsandbytes_unusable(torch.backends.cpu.get_cpu_capability(), cuda) if bnb_version
                      else "bitsandbytes is not installed"),
        notes=(note,) if note else (),
        cpu_vendor=ids.get("vendor_id", ""),
        cpu_family=int(ids["cpu family"]) if ids.get("cpu family", "").isdigit() else None,
    )


@contextlib.contextmanager
def forced(**changes):
    """Within the block, `detect()` reports these fields changed (tests force a fallback this way).

    Code must call `capabilities.detect()` through the module (not a copy taken at import) so
    that this reaches it.
    """
    global detect
    real = detect
    changed = replace(real(), **changes)
    detect = lambda: changed  # noqa: E731 - a stand-in with the same call shape
    try:
        yield changed
    finally:
        detect = real
