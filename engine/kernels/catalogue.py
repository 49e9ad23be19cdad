"""The catalogue of kernels a projection (a Linear) can run on, and how each runs a product.

`Kernel` lists them; `run(kernel, linear, x)` computes linear(x) through one; `prepare(kernel, linear)`
makes the weight copy it reads (a packed oneDNN copy, our fp32 panels) ahead of the first product.
Nothing here chooses: which kernel serves which rows of which projection is the execution plan's
decision (engine/runtime/plan.py), made once per model variant and device.

A quantized weight-only layer (engine/quant/weight_only.py) may hold two layouts: ours
(`has_ours`, run by `ours_product`) and torch's (`torch_product`); the plan names the one that serves.
A w8a layer (engine/quant/w8a.py) runs our integer kernels (`ours_product`), or for a long prompt its
weights dequantized into the fp32 GEMM (`prefill`).

Exactness: `OURS_FP32`, fp32 `ONEDNN_PACKED` and `WO_OURS` give a row the same bits at any row count
(`row_invariant`); the plan calls a kernel that is not once per sequence where a promise of
alone == batched bits is at stake (plain fp32 Linears).

A new kernel (an integer dot product, a dequantized tile feeding a GEMM) is a new member here and a
new row of the plan's table: the runner and the layer loop need no change.
"""

from __future__ import annotations

import enum
import threading

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from engine.kernels import cpu_gemm
from engine.kernels.cpu_gemm import ours
from engine.platform import capabilities


class Kernel(enum.Enum):
    """Every kernel a projection can run on: (short name, what it is, row-invariant in fp32). `roof`: the
    matmul peak its many-row products are held to (engine/measure/machine_limits.py): "int8" for integer
    dot products, None for the model's own dtype."""

    OURS_FP32 = ("ours-fp32", "our fp32 panel kernel (engine/kernels/cpu_gemm.py)", True)
    OURS_BF16 = ("ours-bf16", "our panel kernel over a bf16 Linear's weights: widened exactly, fp32 sums, "
                              "rounded to bf16 once (engine/kernels/cpu_gemm.py)", True)
    OURS_BF16W = ("ours-bf16w", "our panel kernel over bf16 weights for fp32 activations (bf16wo): widened "
                                "exactly, fp32 sums and outputs (engine/kernels/cpu_gemm.py)", True)
    ONEDNN_PACKED = ("onednn-packed", "oneDNN over a pre-packed weight copy", True)
    ATEN = ("aten", "ATen's plain matmul (F.linear: MKL for fp32 on CPU)", False)
    ATEN_NO_ONEDNN = ("aten-no-onednn", "ATen's own bf16 GEMV, oneDNN bypassed", False)
    WO_OURS = ("wo-ours", "our int8/4-bit weight-only kernels (engine/kernels/cpu_gemm.py)", True)
    WO_TORCH = ("wo-torch", "torch's int8/4-bit weight-only kernels", False)
    WO_INT8ACT = ("wo-int8act", "our integer dot-product kernels, activations int8 per block of 32 "
                                "(engine/kernels/cpu_qdot.py)", True)
    WO_DEQUANT_FP32 = ("wo-dequant-fp32", "a w8a layer's weights dequantized once, then the fp32 GEMM (MKL): "
                                          "long prompts", False)
    BNB = ("bnb", "bitsandbytes", False)

    def __init__(self, short: str, what: str, row_invariant: bool):
        self.short, self.what, self.row_invariant = short, what, row_invariant

    @property
    def roof(self) -> str | None:
        return "int8" if self is Kernel.WO_INT8ACT else None


OURS_PANELS = (Kernel.OURS_FP32, Kernel.OURS_BF16, Kernel.OURS_BF16W)  # our panel kernel (cpu_gemm.ours), any weights


def run(kernel: Kernel, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """linear(x) through `kernel`."""
    if kernel in OURS_PANELS:
        return ours(linear, x)
    if kernel is Kernel.ONEDNN_PACKED:
        packed = packed_weight(linear)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")
        return linear(x)  # oneDNN refused this weight once (packed_weight): the plain call, every time
    if kernel is Kernel.WO_OURS:
        return linear.ours_product(x)
    if kernel is Kernel.WO_TORCH:
        return linear.torch_product(x)
    if kernel is Kernel.WO_INT8ACT:
        return linear.ours_product(x)
    if kernel is Kernel.WO_DEQUANT_FP32:
        return linear.prefill(x)
    if kernel is Kernel.ATEN_NO_ONEDNN:
        return _without_onednn(linear, x)
    return linear(x)


def prepare(kernel: Kernel, linear: nn.Module) -> None:
    """Make the weight copy `kernel` reads for `linear` now, not inside a request's first step."""
    if kernel in OURS_PANELS:
        cpu_gemm.panels(linear)
    elif kernel is Kernel.ONEDNN_PACKED:
        packed_weight(linear)


# torch offers no per-call way to keep a bf16 matmul off oneDNN (aten::mm, addmm, mv and matmul all
# consult the process-wide flag), so the flag is switched here and only here: for one product,
# under a lock that `weight_only.onednn_on` (bitsandbytes' matmuls, which need oneDNN on) also takes.
ONEDNN_FLAG_LOCK = threading.RLock()


def _without_onednn(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with ONEDNN_FLAG_LOCK:
        previous = torch._C._get_mkldnn_enabled()
        torch._C._set_mkldnn_enabled(False)
        try:
            return linear(x)
        finally:
            torch._C._set_mkldnn_enabled(previous)


# oneDNN-packed copies of Linear weights, keyed by the weight tensor itself (so a module whose
# weight is replaced, cast or quantized never meets a stale copy; variants pack their own on first use).
_PACKED = WeakIdKeyDictionary()  # weight -> packed copy, or False: this weight cannot be packed


def packed_weight(linear: nn.Module):
    """The oneDNN-packed copy of a plain bf16 or fp32 CPU Linear's weight (made once), else None.

    Why: `F.linear` hands oneDNN a plain weight, which it reorders into its blocked layout on every
    call; for a few rows that reordering is most of the cost (`python -m engine.bench verify`). The
    packed fp32 kernel gives each row the same bits at any row count. Price: a second copy of the
    weights in memory (`packed_bytes`)."""
    if type(linear) is not nn.Linear:  # quantized modules are subclasses or others
        return None
    w = linear.weight
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return None
    p = _PACKED.get(w)
    if p is None:
        caps = capabilities.detect()
        if not (caps.packed_bf16_weights if w.dtype == torch.bfloat16 else caps.packed_fp32_weights):
            return None  # e.g. AVX2-only CPUs for bf16: plain F.linear
        try:
            p = torch.ops.mkldnn._reorder_linear_weight(w.detach())
        except RuntimeError:  # a build or CPU whose oneDNN refuses it: the plain path, once decided
            p = False
        _PACKED[w] = p
    return p if p is not False else None


def drop_packed(modules, dtype: torch.dtype) -> None:
    """Free the packed copies of these modules' `dtype` weights (the plan sends their rows elsewhere)."""
    for module in modules:
        if isinstance(module, nn.Linear) and module.weight.dtype == dtype:
            _PACKED.pop(module.weight, None)


def packed_bytes() -> int:
    """Bytes held by packed weight copies, oneDNN's and our fp32 kernel's panels (all live models)."""
    copies = [p for p in _PACKED.values() if p is not False]
    return sum(p.numel() * p.element_size() for p in copies) + cpu_gemm.panels_bytes()
