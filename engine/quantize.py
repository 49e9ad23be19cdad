"""Quantization variants of a loaded model, each a distinct model object built from it.

Methods (`METHODS`):
  fp32 / bf16 / fp16  the unquantized model in that dtype (a cast; never an upcast, see `_cast`)
  int8    bitsandbytes LLM.int8: int8 weights per output row; activations quantized to int8 per
          row, with outlier columns (|x| > 6) kept in fp16 — the paper's mixed decomposition
  nf4     bitsandbytes 4-bit NormalFloat, blocks of 64 weights, compute in the model dtype
  fp4     bitsandbytes 4-bit float, same layout
  int8wo  weight-only int8 (one scale per output channel) through PyTorch's own
          `torch._weight_int8pack_mm`; activations stay in the model dtype. No extra package.

What is quantized: every `nn.Linear` of the transformer blocks (our fused q/k/v, o, fused
gate/up, down; or the generic model's projections). What is not: the token embedding and
`lm_head`, which SmolLM2 ties into one 49,152 x 576 matrix (21% of its weights), and the norms.
Quantizing `lm_head` with bitsandbytes would untie it — a quantized copy beside the unquantized
embedding, more bytes in all — and costs quality; `python -m engine.bench quant` measures that
choice on a `+head` row (README "Quantization").

A variant shares every tensor it does not quantize with the loaded model (embedding, norms,
rotary tables), so holding several variants costs only their quantized layers. After building,
a short forward runs (the loader's warm-up), so a method the device or the model's layer shapes
cannot run fails here with one `LoadError`, never in the middle of a request.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import sys
import time
from dataclasses import replace

import torch
from torch import nn

from .errors import InvalidRequest, LoadError
from .loader import DTYPE_NAMES, LoadedModel, _first_line, _warm_up

QUANTIZED = {
    "int8": "bitsandbytes LLM.int8 (int8 weights; int8 activations, outliers > 6 in fp16)",
    "nf4": "bitsandbytes 4-bit NormalFloat (blocks of 64), compute in the model dtype",
    "fp4": "bitsandbytes 4-bit float (blocks of 64), compute in the model dtype",
    "int8wo": "int8 weights per output channel, activations in the model dtype (torch._weight_int8pack_mm)",
}
METHODS = {**{name: f"unquantized {name}" for name in DTYPE_NAMES}, **QUANTIZED}
BNB_BLOCKSIZE = 64
BNB_INT8_THRESHOLD = 6.0  # LLM.int8's outlier threshold (also transformers' default)
# bitsandbytes' CPU 4-bit kernel (AVX512-BF16) packs output rows in blocks of 32 and keeps one
# absmax per 64-weight block of each row: it needs out_features % 32 == 0, in_features % 64 == 0.
BNB_CPU_4BIT_ROWS = 32


def method_names() -> list[str]:
    return list(METHODS)


def build_variant(base: LoadedModel, name: str, quantize_lm_head: bool = False) -> LoadedModel:
    """A new model object: `base` in dtype `name`, or with its block linears quantized by `name`.

    Raises InvalidRequest for an unknown name and LoadError for one this device or model cannot
    run (the message says why and what works instead). `base` is left untouched.
    `quantize_lm_head` quantizes `lm_head` too (untying it from the embedding): only for the
    bench's measurement of that choice.
    """
    if name not in METHODS:
        raise InvalidRequest(f"unknown quantization {name!r}; available: {', '.join(METHODS)}", "quantization")
    t0 = time.perf_counter()
    if name in DTYPE_NAMES:
        model = _cast(base, DTYPE_NAMES[name])
        dtype = DTYPE_NAMES[name]
    else:
        model = _quantized(base, name, quantize_lm_head)
        dtype = base.dtype
    try:
        _warm_up(model)  # a short prefill and a decode step: kernels and shapes are checked here
    except Exception as exc:
        raise LoadError(f"quantization {name!r} cannot run on {base.device} with this model: "
                        f"{type(exc).__name__}: {_first_line(exc)}") from exc
    note = f"variant {name}: {METHODS[name]}" + (" (lm_head quantized, untied)" if quantize_lm_head else "")
    return replace(base, model=model, dtype=dtype, load_s=time.perf_counter() - t0, notes=[*base.notes, note])


def precheck(base: LoadedModel, name: str) -> str | None:
    """Why variant `name` cannot run here, known without building it (None: nothing known against it).
    The page shows such a variant disabled with this reason; building may still fail (then the
    VariantSet remembers that reason)."""
    try:
        if name in DTYPE_NAMES:
            if DTYPE_NAMES[name].itemsize > base.dtype.itemsize:
                _cast(base, DTYPE_NAMES[name])  # raises the upcast's reason
        elif name != "int8wo":
            _check_bitsandbytes(name, base)
    except LoadError as exc:
        return str(exc)
    return None


def _cast(base: LoadedModel, dtype: torch.dtype) -> nn.Module:
    if dtype.itemsize > base.dtype.itemsize:
        raise LoadError(
            f"the engine loaded {base.dtype_name} weights; a {_dtype_name(dtype)} copy would hold the same "
            f"rounded values, not the real {_dtype_name(dtype)} model. Start with --dtype {_dtype_name(dtype)} "
            "and compare the narrower dtypes as variants."
        )
    return copy.deepcopy(base.model).to(dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPE_NAMES.items()}[dtype]


def _quantized(base: LoadedModel, name: str, quantize_lm_head: bool) -> nn.Module:
    if name != "int8wo":
        _check_bitsandbytes(name, base)
    # New module objects that share every tensor with the base; the linears are then replaced.
    src = base.model
    model = copy.deepcopy(src, memo={id(t): t for t in itertools.chain(src.parameters(), src.buffers())})
    build = {"int8": _bnb_int8, "nf4": _bnb_4bit, "fp4": _bnb_4bit, "int8wo": Int8WeightOnlyLinear.from_linear}[name]
    for parent, attr, linear in quantizable_linears(model, include_lm_head=quantize_lm_head):
        setattr(parent, attr, build(linear, name=name, device=base.device, dtype=base.dtype))
    return model


def quantizable_linears(model: nn.Module, include_lm_head: bool = False):
    """(parent, attribute, linear) for every plain nn.Linear except lm_head and tied weights."""
    embeddings = {m.weight.untyped_storage().data_ptr() for m in model.modules() if isinstance(m, nn.Embedding)}
    found = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            if type(child) is not nn.Linear:
                continue
            tied = child.weight.untyped_storage().data_ptr() in embeddings
            if attr == "lm_head" or tied:
                if not include_lm_head:
                    continue
            found.append((parent, attr, child))
    return found


def _check_bitsandbytes(name: str, base: LoadedModel) -> None:
    try:
        bnb = _import_bitsandbytes()
    except Exception as exc:
        raise LoadError(f"quantization {name!r} needs bitsandbytes, which failed to load: "
                        f"{type(exc).__name__}: {_first_line(exc)}") from exc
    if name in ("nf4", "fp4") and base.device.type == "cpu" and bnb.functional.has_avx512bf16():
        for _, attr, lin in quantizable_linears(base.model):
            if lin.out_features % BNB_CPU_4BIT_ROWS or lin.in_features % BNB_BLOCKSIZE:
                raise LoadError(
                    f"quantization {name!r} cannot run on this CPU with this model: bitsandbytes' 4-bit CPU "
                    f"kernel needs layers with output sizes divisible by {BNB_CPU_4BIT_ROWS} and input sizes "
                    f"divisible by {BNB_BLOCKSIZE}, and {attr} is {lin.in_features} -> {lin.out_features}. "
                    "Try int8 or int8wo."
                )


def _import_bitsandbytes():
    if "bitsandbytes" not in sys.modules:
        # Two warnings that are noise here: at import, that the optional `kernels` package (which
        # downloads a kernel from the model hub) is missing; and on every int8 forward, that
        # activations are cast to fp16 (which is what LLM.int8 does). Errors still show.
        logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


@contextlib.contextmanager
def _onednn():
    """Switch oneDNN back on inside a quantized matmul.

    FastLlama routes one-row matmuls around oneDNN (its bf16 GEMV is slow), but the int8 kernels
    are faster with it: measured here for one 1 x 576 -> 3072 product, `torch._int_mm`
    (bitsandbytes int8) 3.6 vs 13.2 ms and `torch._weight_int8pack_mm` 1.2 vs 3.8 ms
    (a loaded machine; the ratios are the point).
    """
    if torch._C._get_mkldnn_enabled():
        yield
        return
    torch._C._set_mkldnn_enabled(True)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(False)


_LINEAR_8BIT = None


def _linear_8bit_class():
    """bitsandbytes' Linear8bitLt, its matmul run with oneDNN on (see `_onednn`)."""
    global _LINEAR_8BIT
    if _LINEAR_8BIT is None:
        bnb = _import_bitsandbytes()

        class Linear8bitLtOneDNN(bnb.nn.Linear8bitLt):
            def forward(self, x):
                with _onednn():
                    return super().forward(x)

        _LINEAR_8BIT = Linear8bitLtOneDNN
    return _LINEAR_8BIT


def _bnb_int8(linear: nn.Linear, name: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    bnb = _import_bitsandbytes()
    q = _linear_8bit_class()(linear.in_features, linear.out_features, bias=linear.bias is not None,
                            has_fp16_weights=False, threshold=BNB_INT8_THRESHOLD, device="meta")
    # Int8Params quantizes when moved off the CPU copy: a copy, so the base's weight is untouched.
    q.weight = bnb.nn.Int8Params(linear.weight.detach().to("cpu", copy=True), requires_grad=False,
                                 has_fp16_weights=False)
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return q.to(device)


def _bnb_4bit(linear: nn.Linear, name: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    bnb = _import_bitsandbytes()
    # Double quantization (8-bit absmax) saves ~0.4 bit/weight on CUDA; the CPU kernel converts
    # absmax back to bf16 at its first forward, so there it would only add rounding error.
    nested = device.type == "cuda"
    q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                          compute_dtype=dtype, compress_statistics=nested, quant_type=name, device="meta")
    q.weight = bnb.nn.Params4bit(linear.weight.detach(), requires_grad=False, quant_type=name,
                                 blocksize=BNB_BLOCKSIZE, compress_statistics=nested, module=q)
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return q.to(device)


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (W_int8 * scale).T + b: int8 weights with one scale per output channel.

    Activations stay in the model dtype; `torch._weight_int8pack_mm` reads the int8 weights
    directly, so decode (memory-bound) moves half the bytes of bf16.
    """

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "int8wo", device=None, dtype=None) -> Int8WeightOnlyLinear:
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale.to(linear.weight.dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _onednn():
            y = torch._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight_int8, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def quant_state_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Tensors a bitsandbytes layer keeps outside its parameters and buffers (row scales,
    block absmax, code books), so weight accounting can count them (loader.weight_bytes)."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return []
    found = []
    if isinstance(module, bnb.nn.Linear8bitLt):
        found = [module.state.CB, module.state.SCB, getattr(module.weight, "SCB", None)]
    elif isinstance(module, bnb.nn.Linear4bit):
        qs = getattr(module.weight, "quant_state", None)
        if qs is not None:
            state2 = getattr(qs, "state2", None) if getattr(qs, "nested", False) else None
            found = [qs.absmax, qs.code, getattr(qs, "offset", None)]
            if state2 is not None:
                found += [state2.absmax, state2.code]
    return [t for t in found if isinstance(t, torch.Tensor)]
