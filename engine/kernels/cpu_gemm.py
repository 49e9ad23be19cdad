"""Our AVX2 product kernels (engine/kernels/cpu_gemm.cpp): int8 and 4-bit weight-only, and fp32.

The fp32 one (`fp32_mm`, over a copy of the weight in panels of 16 output channels, `fp32_panels`)
serves plain fp32 Linears for up to plan.OURS_ROWS rows where the per-machine one-row decision picks
it (engine/runtime/plan.py): one row streams the weights faster than oneDNN's packed copy or MKL's
GEMV, and many rows run at about oneDNN's speed (`python -m engine.bench gemv` prints each at every
row count; figures, with CPU and date: docs/history.md). Every output
sums its products in one fixed order, so a row's bits do not depend on the row count, which
continuous batching needs (engine/runtime/eager.py). This module also builds decode attention
(engine/kernels/cpu_attention.py) into the same extension.

Why our own: torch's weight-only kernels read the weights far below the memory's speed on a one-row
product on an AVX2-only CPU (they are written for batches, and convert activations to bf16 in
software), and a decode step is nothing but such products. `python -m engine.bench gemv` sets ours
against theirs on the model's own shapes (figures, with CPU and date: docs/quantization.md).
torchao wraps the same torch kernels on CPU, so no package offers better.

What they compute: int8, the fp32 product with the dequantized weights (fp32 activations; only the
summation order differs). 4-bit, activations quantized to int16 per group of 32 (~15 bits, so the
weights need no float conversion, only unpacking; int8 activations, as llama.cpp uses, were as fast
but cost SmolLM2 ~4 points of top-1 agreement against fp32); relative error ~5e-4 of the largest
output on random data, the fp16 scales' rounding, against ~3e-3 for torch's bf16 activations.

Where they run: x86-64 CPUs where torch itself dispatches AVX2 (its cpuid check, not /proc/cpuinfo,
which an emulator may fill with the host's flags), with a C++ compiler and ninja. They are built at
first use into torch's extension folder (once, seconds; later processes load the cached library),
then checked against a reference. Anything missing or wrong: `unavailable_reason()` says what, and
the weight-only layers keep torch's kernels (engine/quant/weight_only.py).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import platform
import threading
import weakref
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import first_line
from engine.kernels import build_guard, switches
from engine.platform import capabilities

NAME = "latency_lab AVX2 kernels (engine/kernels/cpu_gemm.py)"  # what engine info and the benches call them
GROUP = 32  # the 4-bit kernel's group size (inputs per scale and offset)
PANEL = 16  # the fp32 kernel's output channels per panel (cpu_gemm.cpp: kPanel)
# One extension for all our CPU kernels: these products, decode attention (engine/kernels/cpu_attention.py)
# and the layer loop that calls them (engine/kernels/cpu_layers.py).
# The integer dot-product kernels (engine/kernels/cpu_qdot.py) come in one file per ISA (cpu_qdot.cpp says why).
_SOURCES = [str(Path(__file__).with_name(name)) for name in (
    "cpu_gemm.cpp", "cpu_attention.cpp", "cpu_layers.cpp",
    "cpu_qdot.cpp", "cpu_qdot_quant.cpp", "cpu_fused.cpp", "cpu_qdot_avx2.cpp", "cpu_qdot_vnni512.cpp",
    "cpu_qdot_avxvnni.cpp", "cpu_qdot_amx.cpp", "cpu_tiles.cpp")]
_EXTENSION = "latency_lab_gemv"  # its library's name, and its ops' namespace
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]  # OpenMP: torch's own libgomp runs the threads
log = logging.getLogger(__name__)
_build_lock = threading.Lock()  # the worker may build a variant while the API asks for engine info


def unavailable_reason() -> str | None:
    """Why our product kernels do not run here (None: they do): their switch
    (engine/kernels/switches.py, `gemm`) or the build. Builds them on the first call."""
    return switches.off_reason("gemm") or built_reason()


def built_reason() -> str | None:
    """Why the extension (products, decode attention, layer loop) is not built and checked here
    (None: it is), whatever the switches say. Builds it on the first call."""
    with _build_lock:  # one build and one registration of the ops per process
        return _build()


def available() -> bool:
    return unavailable_reason() is None


def kernel_name(method: str) -> str:
    """What a weight-only layer of `method` ('int8wo' / 'int4wo') decodes with on CPU here."""
    reason = unavailable_reason()
    torch_kernel = {"int8wo": "torch._weight_int8pack_mm", "int4wo": "torch._weight_int4pack_mm_for_cpu"}[method]
    if reason is None:
        return NAME
    return f"{torch_kernel} ({reason})"


@functools.lru_cache(maxsize=1)
def _build() -> str | None:
    caps = capabilities.detect()
    if platform.machine() not in ("x86_64", "AMD64") or caps.torch_cpu_capability not in ("AVX2", "AVX512"):
        return f"needs an x86-64 CPU with AVX2 (torch dispatches {caps.torch_cpu_capability} here)"
    if "f16c" not in caps.isa:
        return "needs F16C (half-precision conversions), which this CPU lacks"
    if not caps.cpp_compiler:
        return "no C++ compiler found (install g++) to build it"
    if importlib.util.find_spec("ninja") is None:
        return "the ninja package is missing (pip install ninja) to build it"
    from torch.utils import cpp_extension

    try:
        # torch's own folder for the name (TORCH_EXTENSIONS_DIR or its cache), held while we build
        folder = cpp_extension._get_build_directory(_EXTENSION, verbose=False)
        with build_guard.exclusive_build(folder):
            module = cpp_extension.load(name=_EXTENSION, sources=_SOURCES, extra_cflags=_FLAGS, build_directory=folder,
                                        extra_ldflags=["-fopenmp"], is_python_module=True, verbose=False)
        _register_fakes()
        global _wide, _module
        _wide, _module = wide_fp32(), module
        _self_check()
    except Exception as exc:  # a failed build or a wrong result: torch's kernels serve instead
        reason = f"could not be built or gave wrong results: {type(exc).__name__}: {first_line(exc)}"
        log.warning("cpu_gemm: %s", reason)
        return reason
    return None


def _register_fakes() -> None:
    """Shapes for torch.compile: the compiled decode step traces these ops as opaque calls."""
    @torch.library.register_fake("latency_lab_gemv::fp32_mm")
    def _(x, panels, n, wide):
        return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("latency_lab_gemv::int8_gemv")
    def _(x, w, scale):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("latency_lab_gemv::int4_gemv")
    def _(x, w, scale, offset, group_size):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("latency_lab_gemv::qdot_dequantize")
    def _(w, scale):
        return w.new_empty(w.shape[0], w.shape[1] * 8 // 5 if scale is None else w.shape[1], dtype=torch.float32)

    @torch.library.register_fake("latency_lab_gemv::qdot_int8")
    def _(x, w, scale, isa):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("latency_lab_gemv::qdot_int4")
    def _(x, w, isa):
        return x.new_empty(x.shape[0], w.shape[0])


def _self_check() -> None:
    """The kernels against the dequantized fp32 product (the panels: over fp32 and bf16 weights, and the AVX-512
    form against the AVX2 one), at row counts inside and across the 4-row blocks: a miscompiled or
    misdispatched kernel must not serve (tolerances: int8 and the panels exact up to summation order; 4-bit
    within its int16 activation rounding)."""
    gen = torch.Generator().manual_seed(0)
    n, k = 72, 96  # not multiples of the row split, two int4 group pairs and a tail group
    w = torch.randn(n, k, generator=gen)
    q8, s8 = quantize_int8(w)
    q4 = torch.randint(0, 16, (n, k), generator=gen)
    scale, zero = torch.rand(n, k // GROUP, generator=gen) * 0.1, torch.randn(n, k // GROUP, generator=gen) * 0.1
    packed, s16, o16 = pack_int4(q4, scale, zero)
    scale, zero = s16.float(), o16.float() + 8 * s16.float()  # what the kernel holds
    w4 = (q4.float() - 8) * scale.repeat_interleave(GROUP, 1) + zero.repeat_interleave(GROUP, 1)
    panel_weights = {"fp32": w, "bf16-weight": w.bfloat16()}
    panels = {what: fp32_panels(weight) for what, weight in panel_weights.items()}  # built once, read at every m
    for m in (1, 2, 3, 4, 5, 8, 9):
        x = torch.randn(m, k, generator=gen)
        _close(int8_gemv(x, q8, s8), x @ (q8.float() * s8[:, None]).T, 1e-5, "int8")
        _close(int4_gemv(x, packed, s16, o16), x @ w4.T, 1e-3, "4-bit")
        for what, weight in panel_weights.items():
            got = fp32_mm(x, panels[what], n)
            _close(got, x @ weight.float().T, 1e-5, what)
            if _wide and not torch.equal(torch.ops.latency_lab_gemv.fp32_mm(x, panels[what], n, False), got):
                raise RuntimeError(f"{what} kernel: AVX-512 and AVX2 differ at {m} rows")


def _close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    err = float((got - want).abs().max() / want.abs().max())
    if not err < tol:
        raise RuntimeError(f"{what} kernel: relative error {err:.2g} at {got.shape[0]} rows (limit {tol})")


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: the layout both our kernel and torch's read."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor):
    """Our 4-bit layout from q in 0..15 [N, K] with w = (q - 8) * scale + zero per group of 32
    (scale, zero: [N, K / 32]): 16 bytes a group (byte j: q[j] low, q[j + 16] high), scale and
    offset (zero - 8 * scale) in fp16. Returns None where fp16 cannot hold them."""
    n, k = q.shape
    g = q.reshape(n, k // GROUP, GROUP).to(torch.uint8)
    packed = (g[..., : GROUP // 2] | (g[..., GROUP // 2 :] << 4)).reshape(n, k // 2).contiguous()
    s16, o16 = scale.half().contiguous(), (zero - 8 * scale).half().contiguous()
    if not (torch.isfinite(s16).all() and torch.isfinite(o16).all()):
        return None
    return packed, s16, o16


def fp32_panels(weight: torch.Tensor) -> torch.Tensor:
    """What `fp32_mm` reads: weight [N, K] fp32 or bf16 as panels [ceil(N / 16), K, 16] of its dtype (16 output
    channels side by side for each input; the last panel padded with zeros). A copy: the weight's size again."""
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = torch.nn.functional.pad(weight.detach(), (0, 0, 0, panels * PANEL - n))
    return padded.reshape(panels, PANEL, k).transpose(1, 2).contiguous()


def fp32_mm(x: torch.Tensor, panels: torch.Tensor, n: int) -> torch.Tensor:
    """x [M, K] fp32 @ weight.T -> [M, n] fp32, from `fp32_panels(weight)` (each output summed in one
    fixed order: a row's bits are the same at any M, and on either kernel, AVX-512 or AVX2). bf16 panels
    give the fp32 product of the bf16 weights (each widened exactly), half the bytes streamed."""
    return torch.ops.latency_lab_gemv.fp32_mm(x, panels, n, _wide)


def wide() -> bool:
    """Whether fp32_mm runs its AVX-512 form here (decided when the kernels were built)."""
    return _wide


def wide_fp32() -> bool:
    """Whether the fp32 kernel runs its AVX-512 form (8 rows a pass) here: where torch dispatches
    AVX-512 (ATEN_CPU_CAPABILITY=avx2 turns it off, as it does torch's own)."""
    return capabilities.detect().torch_cpu_capability == "AVX512"


_wide = False  # wide_fp32(), decided once when the kernels are built (a plain global: the compiled step reads it)
_module = None  # the built extension as a Python module: its bindings (the layer loop's call) beside its torch ops


def extension():
    """The built extension's Python bindings (engine/kernels/cpu_layers.cpp: `Layers`, `batch_layers`); build
    first (unavailable_reason() is None)."""
    assert _module is not None, "the kernels are not built here"
    return _module


def int8_gemv(x: torch.Tensor, weight_int8: torch.Tensor, scale_fp32: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 @ (weight_int8 [N, K] * scale [N]).T -> [M, N] fp32 (each row computed alone: the same bits at any M)."""
    return torch.ops.latency_lab_gemv.int8_gemv(x, weight_int8, scale_fp32)


def int4_gemv(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 @ the 4-bit weights of `pack_int4`.T -> [M, N] fp32 (each row computed alone: the same bits at any M)."""
    return torch.ops.latency_lab_gemv.int4_gemv(x, packed, scale, offset, GROUP)


# --- our panel kernel on a model's Linears (the catalogue, cpu_layers, the compiled step) ---
def plain_cpu(linear: nn.Module, dtype: torch.dtype = torch.float32) -> bool:
    """A plain (not quantized) Linear with a contiguous CPU weight of `dtype` (fp32; bf16: the panels of its
    bf16 weights): what our panel kernel takes. Tensor properties only, so the compiled step can ask it
    while tracing."""
    return type(linear) is nn.Linear and _panel_weight(linear, dtype)


def fp32_rows(linear: nn.Module) -> bool:
    """Whether our panel kernel takes `linear`'s fp32 rows to fp32 outputs: a plain fp32 Linear (fp32 panels), or
    a layer that keeps bf16 weights for fp32 products (engine/quant/bf16_weights.py, known by `bf16_weights`:
    bf16 panels, widened exactly). What the C++ layer loop's fp32 projections are."""
    return plain_cpu(linear) or (getattr(linear, "bf16_weights", False) and _panel_weight(linear, torch.bfloat16))


def _panel_weight(linear: nn.Module, dtype: torch.dtype) -> bool:
    """Whether `linear`'s weight is one our panels can be made from: contiguous, on the CPU, of `dtype`."""
    w = getattr(linear, "weight", None)
    return w.dtype == dtype and w.device.type == "cpu" and w.is_contiguous()


class _Panels:
    """Our fp32 kernel's copy of one Linear's weight (fp32_panels), kept on the module, where
    the compiled step's tracing can read it. Not deep-copied: a variant copied from the model makes
    its own on first use. `weight`: the tensor it was made from (a replaced weight is packed again)."""

    __slots__ = ("weight", "panels", "__weakref__")

    def __init__(self, weight: torch.Tensor):
        self.weight, self.panels = weight, fp32_panels(weight)
        _PANELS.add(self)

    def __deepcopy__(self, memo):
        return None


_PANELS = weakref.WeakSet()  # every live _Panels: their bytes count in catalogue.packed_bytes()


def panels_bytes() -> int:
    """Bytes held by every live model's panel copies."""
    return sum(h.panels.numel() * h.panels.element_size() for h in _PANELS)


def panels(linear: nn.Linear) -> torch.Tensor:
    """The panels our fp32 kernel reads for `linear` (made once)."""
    held = linear.__dict__.get("_ours_panels")
    if held is None or held.weight is not linear.weight:
        held = linear.__dict__["_ours_panels"] = _Panels(linear.weight)
    return held.panels


def ours(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x) through our panel kernel: the same bits for a row in any batch. A bf16 Linear: its bf16
    activations widened to fp32, the fp32 sums (and bias) rounded to bf16 once, as a bf16 matmul does. A layer
    with bf16 weights for fp32 products (`fp32_rows`): fp32 in, fp32 out."""
    y = fp32_mm(x.reshape(-1, x.shape[-1]).float().contiguous(), panels(linear), linear.out_features)
    if linear.bias is not None:
        y = y + linear.bias.float()
    return y.to(x.dtype).view(*x.shape[:-1], y.shape[-1])
