"""The one kernel decision: which kernel runs a projection (a Linear) for a given number of rows.

Every forward (engine/model/forward.py: a batch of sequences, one sequence being a batch of one)
asks `choose(linear, rows, plan)` and runs the answer with `run(kernel, linear, x)`; nothing else
picks a matmul kernel. `rows` is the row count of ONE sequence's part of the product, so a
sequence gets the same kernel, and so the same bits, alone and beside others. `plan` is the
model's per-machine decision for fp32 rows (engine/kernels/plan.py: our kernel by rule where it
builds, else measured once per machine and cached; injectable by tests).

The table (`Kernel`, first match wins):
- a weight-only int8/4-bit layer: ours (`WO_OURS`) where it holds our layout and its `gemv` flag is
  set (engine/quant/weight_only.py decides that, measured), else torch's (`WO_TORCH`);
- a bitsandbytes layer: `BNB`; any other non-Linear module, or a weight off the CPU: `ATEN` (its own call);
- fp32 CPU Linear: `OURS_FP32` for up to OURS_ROWS rows where the plan picked ours and it builds;
  else `ONEDNN_PACKED` for 2..PACKED_FP32_MAX rows (1 row too where the plan picked it), where
  oneDNN packs fp32; else `ATEN` (MKL);
- bf16 CPU Linear: `ATEN_NO_ONEDNN` for 1-2 rows (oneDNN's bf16 GEMM is slow for a row or two:
  `python -m engine.bench dtypes`), `ONEDNN_PACKED` from 3 rows where oneDNN packs bf16, else `ATEN`;
- anything else: `ATEN`.
Packed fp32 stops at PACKED_FP32_MAX rows because long prefills were faster through MKL
(`python -m engine.bench verify` and `bandwidth` measure both).

Exactness: `OURS_FP32` and fp32 `ONEDNN_PACKED` give a row the same bits at any row count
(`row_invariant`); where a kernel is not, a batched forward calls it once per sequence
(`per_sequence`), so greedy fp32 output never depends on who shares the forward.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from engine.kernels import cpu_gemm
from engine.kernels.cpu_gemm import ours, plain_fp32_cpu
from engine.platform import capabilities

OURS_ROWS = 256  # our fp32 kernel serves a sequence of up to this many rows: every prompt chunk the scheduler makes
PACKED_FP32_MAX = 128  # fp32 rows from 2 up to this through the packed copy; longer prefills through MKL


class Kernel(enum.Enum):
    """Every kernel a projection can run on: (short name, what it is, row-invariant in fp32)."""

    OURS_FP32 = ("ours-fp32", "our fp32 panel kernel (engine/kernels/cpu_gemm.py)", True)
    ONEDNN_PACKED = ("onednn-packed", "oneDNN over a pre-packed weight copy", True)
    ATEN = ("aten", "ATen's plain matmul (F.linear: MKL for fp32 on CPU)", False)
    ATEN_NO_ONEDNN = ("aten-no-onednn", "ATen's own bf16 GEMV, oneDNN bypassed", False)
    WO_OURS = ("wo-ours", "our int8/4-bit weight-only kernels (engine/kernels/cpu_gemm.py)", True)
    WO_TORCH = ("wo-torch", "torch's int8/4-bit weight-only kernels", False)
    # PROVISIONAL (issue 41, until the plan of issue 40 lands): the w8a layers' integer kernels
    WO_INT8ACT = ("wo-int8act", "our integer dot-product kernels, activations int8 per block of 32 "
                                "(engine/kernels/cpu_qdot.py)", True)
    WO_DEQUANT_FP32 = ("wo-dequant-fp32", "a w8a layer's weights dequantized once, then the fp32 GEMM (MKL): "
                                          "long prompts", False)
    BNB = ("bnb", "bitsandbytes", False)

    def __init__(self, short: str, what: str, row_invariant: bool):
        self.short, self.what, self.row_invariant = short, what, row_invariant


@dataclass(frozen=True)
class Plan:
    """A model's fp32 one-row decision: `one_row` is 'ours', 'packed' or 'gemv' (MKL); `source`
    says where it came from (measured, cached, injected, default); `measured`: the step times."""

    one_row: str = "gemv"
    source: str = "default"
    measured: dict | None = None


DEFAULT_PLAN = Plan()


def plan_of(model) -> Plan:
    return getattr(model, "kernel_plan", None) or DEFAULT_PLAN


def choose(linear: nn.Module, rows: int, plan: Plan = DEFAULT_PLAN) -> Kernel:
    """The kernel that runs `linear` on `rows` rows of one sequence (see the module's table)."""
    kind = type(linear)
    if kind is not nn.Linear:
        if getattr(linear, "int8_activations", False):  # engine/quant/w8a.py (PROVISIONAL: a plan entry later)
            # past OURS_ROWS rows (as fp32's rows go to MKL) the fp32 GEMM over dequantized weights wins
            return Kernel.WO_DEQUANT_FP32 if rows > OURS_ROWS and _on_cpu(linear) else Kernel.WO_INT8ACT
        if hasattr(linear, "has_ours"):  # engine/quant/weight_only._WeightOnlyLinear (not imported: no cycle)
            return Kernel.WO_OURS if linear.gemv and _on_cpu(linear) else Kernel.WO_TORCH
        return Kernel.BNB if kind.__module__.startswith(("bitsandbytes", "engine.quant.bnb")) else Kernel.ATEN
    w = linear.weight
    if w.device.type != "cpu":
        return Kernel.ATEN
    caps = capabilities.detect()
    if w.dtype == torch.float32:
        if rows <= OURS_ROWS and plan.one_row == "ours" and plain_fp32_cpu(linear) and cpu_gemm.available():
            return Kernel.OURS_FP32
        lo = 1 if plan.one_row == "packed" else 2
        if lo <= rows <= PACKED_FP32_MAX and caps.packed_fp32_weights:
            return Kernel.ONEDNN_PACKED
        return Kernel.ATEN
    if w.dtype == torch.bfloat16:
        if rows <= 2:
            return Kernel.ATEN_NO_ONEDNN if torch.backends.mkldnn.is_available() else Kernel.ATEN
        return Kernel.ONEDNN_PACKED if caps.packed_bf16_weights else Kernel.ATEN
    return Kernel.ATEN


def _on_cpu(module: nn.Module) -> bool:
    return next(module.buffers()).device.type == "cpu"


def per_sequence(kernel: Kernel, linear: nn.Module) -> bool:
    """Whether a batched forward must call `kernel` once per sequence: it is not row-invariant and
    the layer is a plain fp32 Linear, whose greedy output is promised the same alone and batched."""
    if kernel is Kernel.WO_DEQUANT_FP32:  # its layers promise a row the same bits alone and batched too
        return True
    return not kernel.row_invariant and type(linear) is nn.Linear and linear.weight.dtype == torch.float32


def run(kernel: Kernel, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """linear(x) through `kernel` (what `choose` said for x's rows)."""
    if kernel is Kernel.OURS_FP32:
        return ours(linear, x)
    if kernel is Kernel.ONEDNN_PACKED:
        packed = packed_weight(linear)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")
        return linear(x)  # oneDNN refused this weight once (packed_weight): the plain call, every time
    if kernel is Kernel.ATEN_NO_ONEDNN:
        return _without_onednn(linear, x)
    if kernel is Kernel.WO_DEQUANT_FP32:
        return linear.prefill(x)
    return linear(x)


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


def drop_packed(model: nn.Module, dtype: torch.dtype) -> None:
    """Free the packed copies of `model`'s `dtype` weights (the plan sends their rows elsewhere)."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.dtype == dtype:
            _PACKED.pop(module.weight, None)


def packed_bytes() -> int:
    """Bytes held by packed weight copies, oneDNN's and our fp32 kernel's panels (all live models)."""
    copies = [p for p in _PACKED.values() if p is not False]
    return sum(p.numel() * p.element_size() for p in copies) + cpu_gemm.panels_bytes()


def prepare(model: nn.Module, rows=(1, 2, 3)) -> None:
    """Make the weight copies the model's short forwards read (panels, packed copies) now, not
    inside a request's first step (a no-op once made)."""
    plan = plan_of(model)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            for kernel in {choose(module, n, plan) for n in rows}:
                if kernel is Kernel.OURS_FP32:
                    cpu_gemm.panels(module)
                elif kernel is Kernel.ONEDNN_PACKED:
                    packed_weight(module)


def used(model, rows: int) -> str:
    """The kernels `model`'s projections (blocks and head) run on for a sequence of `rows` rows, by
    short name ('ours-fp32', or 'wo-ours+aten' where the head differs): engine info and timelines."""
    plan = plan_of(model)
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return "transformers"
    linears = [lin for blk in blocks for lin in (blk.qkv, blk.o, blk.gate_up, blk.down)] + [model.lm_head]
    names = dict.fromkeys(choose(lin, rows, plan).short for lin in linears)
    return "+".join(names)


def for_reply(model, prefill_rows: int, compiled: bool = False) -> dict:
    """A reply's timeline (`counters["kernels"]`): the kernels its prefill and its decode steps ran on."""
    return {"prefill": used(model, max(1, prefill_rows)),
            "decode": "compiled graph (engine/model/compiled_step.py)" if compiled else used(model, 1)}


def describe(model) -> dict:
    """Engine info: which kernels serve a prompt and a decode step, the plan behind the choice, what
    each short name means, and each kernel switch (engine/kernels/switches.py)."""
    from engine.kernels import switches

    plan = plan_of(model)
    return {"prefill": used(model, 64), "decode": used(model, 1),
            "one_row": {"choice": plan.one_row, "source": plan.source, **(plan.measured or {})},
            "names": {k.short: k.what for k in Kernel}, "switches": switches.describe()}
