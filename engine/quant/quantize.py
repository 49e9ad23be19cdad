"""Quantization variants of a loaded model, each a distinct model object built from it.

Methods (`METHODS`):
  fp32 / bf16 / fp16  the unquantized model in that dtype (a cast; never an upcast, see `_cast`)
  int8    bitsandbytes LLM.int8: int8 weights per output row; activations quantized to int8 per
          row, with outlier columns (|x| > 6) kept in fp16 — the paper's mixed decomposition
  nf4     bitsandbytes 4-bit NormalFloat, blocks of 64 weights, compute in the model dtype
  fp4     bitsandbytes 4-bit float, same layout
  int8wo  weight-only int8 (one scale per output channel) through PyTorch's own
          `torch._weight_int8pack_mm`
  int4wo  weight-only 4-bit, asymmetric (a scale and a zero per group of `INT4_GROUP_SIZE` input
          weights) through PyTorch's own `torch._weight_int4pack_mm_for_cpu` (CUDA:
          `torch._weight_int4pack_mm`)
  int8wo+head, int4wo+head   the same, with `lm_head` quantized too (see below)
  int4wo+head8   int4wo blocks, `lm_head` in int8wo: SmolLM2's blocks survive 4 bits (its GGUF
                 is already 4-bit), its lm_head (8-bit in the GGUF) does not
  bf16wo, bf16wo+head   bf16 weights with fp32 activations, sums, norms and KV (engine/quant/bf16_weights.py):
          half of fp32's bytes, the weights' rounding the only error; CPU only, over an fp32 load
  int8w8a, int4w8a, int8w8a+head, int4w8a+head8 (lm_head int8w8a)   int8wo's / int4wo's weights with the
          activations quantized to int8 per block of 32 in every product: integer dot products
          (engine/quant/w8a.py, engine/kernels/cpu_qdot.py), CPU only; other bits than the wo variants,
          hence other names. No int4w8a+head: retired (`RETIRED` says why and what replaces it)

The weight-only kernels and their activation dtype: engine/quant/weight_only.py; bitsandbytes: engine/quant/bnb.py.

What is quantized: every `nn.Linear` of the transformer blocks (our fused q/k/v, o, fused
gate/up, down; or the generic model's projections). Not the token embedding, nor the norms.
SmolLM2 ties `lm_head` to the embedding (one 49,152 x 576 matrix, 21% of its weights): the plain
variants leave it tied and unquantized; the `+head` variants give `lm_head` its own quantized copy
(the embedding lookup keeps reading the original), which adds that copy's bytes to the total but
cuts the bytes a decode step reads: a step reads all of lm_head and one row of the embedding.
`python -m engine.bench quant` measures both (docs/quantization.md).

A variant shares every tensor it does not quantize with the loaded model (embedding, norms,
rotary tables), so holding several variants costs only their quantized layers. Whoever builds a
variant then makes its execution plan and runner and runs a short forward through it (the runner's
warm-up, engine/serving/variants.py), so a method the device or the model's layer shapes cannot run
fails there with one `LoadError`, never in the middle of a request. The weight-only kernels'
activation dtype is the plan's decision (engine/runtime/plan.py `weight_only_activations`), passed in.
"""


from __future__ import annotations

import copy
import itertools
import traceback
from collections.abc import Mapping
from dataclasses import replace

import torch
from torch import nn

from engine.core import clock
from engine.core.errors import InvalidRequest, LoadError
from engine.model.loaded import DTYPE_NAMES, LoadedModel, first_line
from engine.platform import capabilities
from engine.quant import bnb, w8a
from engine.quant.bf16_weights import Bf16WeightLinear
from engine.quant.weight_only import (
    INT8_CUDA_CAVEAT,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    dtype_name,
    shape_rule,
)

QUANTIZED = {
    "int8": "bitsandbytes LLM.int8 (int8 weights; int8 activations, outliers > 6 in fp16)",
    "nf4": "bitsandbytes 4-bit NormalFloat (blocks of 64), compute in the model dtype",
    "fp4": "bitsandbytes 4-bit float (blocks of 64), compute in the model dtype",
    "int8wo": "int8 weights per output channel (torch._weight_int8pack_mm), activations in its fast dtype",
    "int8wo+head": "int8wo with lm_head quantized too (its own int8 copy; the embedding stays)",
    "int4wo": "4-bit weights, scale+zero per group of 32 (torch._weight_int4pack_mm), activations in its fast dtype",
    "int4wo+head": "int4wo with lm_head quantized too (its own 4-bit copy; the embedding stays)",
    "int4wo+head8": "int4wo with lm_head in int8 (int8wo's kernel): most of +head's speed, little of its error",
    # bf16 weights, fp32 everything else (engine/quant/bf16_weights.py): not the `bf16` cast, hence its own name
    "bf16wo": "bf16 weights, fp32 activations and sums: half of fp32's bytes a decode step, on our fp32 panel "
              "kernel and the C++ layer loop (CPU)",
    "bf16wo+head": "bf16wo with lm_head in bf16 too (its own copy; the embedding stays fp32)",
    # int8 activations: the products quantize x per block of 32 (engine/quant/w8a.py), so the bits change: the name says so
    "int8w8a": "int8wo's weights, activations quantized to int8 per block of 32: integer dot products (CPU)",
    "int8w8a+head": "int8w8a with lm_head quantized too (its own int8 copy; the embedding stays)",
    "int4w8a": "int4wo's weights, activations quantized to int8 per block of 32: integer dot products (CPU)",
    "int4w8a+head8": "int4w8a with lm_head in int8w8a (its own int8 copy; the embedding stays): the fastest decode "
                     "on our integer kernels, measured quality (docs/quantization.md)",
}
# What `+suffix` does to lm_head: quantize it with the variant's own method, or with int8wo.
HEAD_SUFFIXES = {"head": None, "head8": "int8wo"}
WEIGHT_ONLY = ("int8wo", "int4wo")  # torch's own kernels (below)
INT8_ACTIVATIONS = ("int8w8a", "int4w8a")  # our integer dot-product kernels (engine/quant/w8a.py), CPU only
FP32_ACTIVATIONS = ("bf16wo",)  # narrower weights for an fp32 model's products (engine/quant/bf16_weights.py), CPU only
METHODS = {**{name: f"unquantized {name}" for name in DTYPE_NAMES}, **QUANTIZED}
# Variants once offered, now refused with what to pick instead (a saved config or an old client may still
# name one). int4w8a+head: its 4-bit lm_head with int8 activations missed issue 41's quality bound (top-1
# agreement within 2 points of int4wo+head's) and int4w8a+head8 was faster in every peer run
# (`python -m engine.bench quant`, `python -m engine.bench peer`; docs/quantization.md, 2026-12-05).
RETIRED = {"int4w8a+head": ("int4w8a+head8", "its 4-bit lm_head with int8 activations fell short of the quality "
                            "target (top-1 agreement with fp32 within 2 points of int4wo+head's)")}


def check_name(name: str, available=None) -> str:
    """`name` if it names a variant (METHODS); else InvalidRequest saying what to pick: the replacement of a
    retired variant, or the `available` names (default: METHODS)."""
    if name in METHODS:
        return name
    if name in RETIRED:
        instead, why = RETIRED[name]
        raise InvalidRequest(f"quantization {name!r} was retired: {why}; use {instead!r} instead", "quantization")
    raise InvalidRequest(f"unknown quantization {name!r}; available: {', '.join(available or METHODS)}",
                         "quantization")


def build_variant(base: LoadedModel, name: str, activations: Mapping[str, torch.dtype] | None = None,
                  quantize_lm_head: bool = False) -> LoadedModel:
    """A new model object: `base` in dtype `name`, or with its block linears quantized by `name`.

    `activations`: the activation dtype of each weight-only method the variant uses (the plan's
    decision, engine/runtime/plan.py `weight_only_activations`). Raises InvalidRequest for an unknown
    name and LoadError for one this device or model cannot run (the message says why and what works
    instead). `base` is left untouched. `quantize_lm_head` quantizes `lm_head` too (untying it from
    the embedding): only for the bench's measurement of that choice.
    """
    check_name(name)
    method, head = split_name(name)
    if quantize_lm_head and head is None:
        head = method
    t0 = clock.now_ns()
    for m in {method, head} & set(WEIGHT_ONLY):  # refused here, before building, if its kernel is missing
        check_weight_only(m, base, m == head)
        if m not in (activations or {}):
            raise ValueError(f"{m}: its activation dtype is the plan's decision, and none was given")
    if method in INT8_ACTIVATIONS:  # (a +head8 head is int8w8a too: the same check)
        _check_w8a(base, head is not None)
    if method in FP32_ACTIVATIONS:
        _check_fp32_activations(method, base)
    extra = f" (here: {dtype_name(activations[method])})" if method in WEIGHT_ONLY else ""
    try:
        model = _cast(base, DTYPE_NAMES[method]) if method in DTYPE_NAMES else _quantized(base, method, head,
                                                                                           activations or {})
    except LoadError:
        raise
    except Exception as exc:  # a native library that fails at its first call, out of memory...
        raise build_failure(name, base.device, exc) from exc
    dtype = torch.float32 if method in INT8_ACTIVATIONS else DTYPE_NAMES.get(method, base.dtype)
    note = f"variant {name}: {describe(name, base.device)}{extra}" + (f" (lm_head {head}, untied)" if head else "")
    return replace(base, model=model, dtype=dtype, load_s=(clock.now_ns() - t0) / 1e9, notes=[*base.notes, note])


def build_failure(name: str, device: torch.device, exc: Exception) -> LoadError:
    """One clear LoadError for a build that failed half-way; VariantSet keeps it, so later requests for
    the variant get it at once instead of another build (for bitsandbytes, another copy of every weight
    through host memory)."""
    oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
    if device.type == "cuda":  # the half-built layers live on only in the traceback's frames: drop them,
        traceback.clear_frames(exc.__traceback__)  # then hand their blocks back to the driver
        torch.cuda.empty_cache()
    advice = ("free memory for it: fewer resident variants (--variants-budget-mb), a smaller --kv-cache-mb, "
              "or a smaller model" if oom else "pick another quantization")
    return LoadError(f"quantization {name!r} could not be built on {device}"
                     f"{' (out of memory)' if oom else ''}: {type(exc).__name__}: {first_line(exc)}; {advice}")


def precheck(base: LoadedModel, name: str) -> str | None:
    """Why variant `name` cannot run here, known without building it (None: nothing known against it).
    The page shows such a variant disabled with this reason; building may still fail (then the
    VariantSet remembers that reason)."""
    method, head = split_name(name)
    try:
        if method in DTYPE_NAMES:
            if DTYPE_NAMES[method].itemsize > base.dtype.itemsize:
                _cast(base, DTYPE_NAMES[method])  # raises the upcast's reason
        elif method in WEIGHT_ONLY:
            for m in {method, head} - {None}:
                check_weight_only(m, base, m == head)
        elif method in INT8_ACTIVATIONS:  # (a +head8 head is int8w8a too: the same check)
            _check_w8a(base, head is not None)
        elif method in FP32_ACTIVATIONS:
            _check_fp32_activations(method, base)
        else:
            bnb.check(method, base, quantizable_linears(base.model))
    except LoadError as exc:
        return str(exc)
    return None


def split_name(name: str) -> tuple[str, str | None]:
    """'int8wo+head' -> ('int8wo', 'int8wo'); 'int4wo+head8' -> ('int4wo', 'int8wo'); 'int4wo' -> ('int4wo', None):
    the blocks' method and lm_head's (None: lm_head stays as loaded)."""
    method, plus, suffix = name.partition("+")
    if not plus:
        return method, None
    if method in INT8_ACTIVATIONS and suffix == "head8":  # the int8 head with int8 activations too
        return method, "int8w8a"
    return method, HEAD_SUFFIXES[suffix] or method


def _cast(base: LoadedModel, dtype: torch.dtype) -> nn.Module:
    if dtype.itemsize > base.dtype.itemsize:
        raise LoadError(
            f"the engine loaded {base.dtype_name} weights; a {dtype_name(dtype)} copy would hold the same "
            f"rounded values, not the real {dtype_name(dtype)} model. Start with --dtype {dtype_name(dtype)} "
            "and compare the narrower dtypes as variants."
        )
    return copy.deepcopy(base.model).to(dtype)


_BNB = {"int8": bnb.int8_linear, "nf4": bnb.four_bit_linear, "fp4": bnb.four_bit_linear}
_WEIGHT_ONLY = {"int8wo": Int8WeightOnlyLinear.from_linear, "int4wo": Int4WeightOnlyLinear.from_linear}
_FROM_LINEAR = {"int8w8a": w8a.Int8W8ALinear.from_linear, "int4w8a": w8a.Int4W8ALinear.from_linear,
                "bf16wo": Bf16WeightLinear.from_linear}  # the layers built from the linear alone


def _quantized(base: LoadedModel, name: str, head: str | None, activations: Mapping[str, torch.dtype]) -> nn.Module:
    if name not in WEIGHT_ONLY + INT8_ACTIVATIONS + FP32_ACTIVATIONS:
        bnb.check(name, base, quantizable_linears(base.model))
    # New module objects that share every tensor with the base; the linears are then replaced.
    src = base.model
    model = copy.deepcopy(src, memo={id(t): t for t in itertools.chain(src.parameters(), src.buffers())})
    for parent, attr, linear in quantizable_linears(model, include_lm_head=head is not None):
        method = head if attr == "lm_head" else name
        if method in _WEIGHT_ONLY:
            layer = _WEIGHT_ONLY[method](linear, compute_dtype=activations[method])
        elif method in _FROM_LINEAR:
            layer = _FROM_LINEAR[method](linear)
        else:
            layer = _BNB[method](linear, name=method, device=base.device, dtype=base.dtype)
        setattr(parent, attr, layer)
    if name in INT8_ACTIVATIONS:
        w8a.widen(model)  # fp32 activations throughout, so the C++ layer loop runs it (w8a.widen says why)
        w8a.gather(model)  # their weights in one huge-page region: streamed faster
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


def _check_w8a(base: LoadedModel, include_lm_head: bool) -> None:
    """Refuse, before building, an int8-activation variant this device or these layer shapes cannot run."""
    w8a.check(base.device, [(lin.in_features, lin.out_features)
                            for _, _, lin in quantizable_linears(base.model, include_lm_head=include_lm_head)])


def _check_fp32_activations(method: str, base: LoadedModel) -> None:
    """Refuse, before building, bf16wo where it cannot mean what it says: off the CPU, or over a model whose
    activations are not fp32 (a bf16 load's weights are bf16 already)."""
    if base.device.type != "cpu":
        raise LoadError(f"quantization {method!r} runs on CPU (our panel kernel); on {base.device.type} pick bf16")
    if base.dtype != torch.float32:
        raise LoadError(f"quantization {method!r} keeps fp32 activations over bf16 weights; the engine loaded "
                        f"{dtype_name(base.dtype)}, so start it with --dtype fp32 (or compare the bf16 cast)")


def weight_only_shapes(method: str, base: LoadedModel, include_lm_head: bool) -> tuple[tuple[int, int], ...]:
    """The (in, out) shapes of the Linears a weight-only `method` quantizes in `base`."""
    return tuple(sorted({(lin.in_features, lin.out_features)
                         for _, _, lin in quantizable_linears(base.model, include_lm_head=include_lm_head)}))


def check_weight_only(method: str, base: LoadedModel, include_lm_head: bool) -> None:
    """Refuse, before building, a weight-only variant whose kernel or layer shapes this machine lacks."""
    caps, device = capabilities.detect(), base.device
    if method == "int8wo" and not caps.int8_weight_only_kernel:
        raise LoadError("quantization 'int8wo' needs torch._weight_int8pack_mm, which this torch build lacks; "
                        "pick int8 (bitsandbytes) or bf16")
    if method == "int4wo":
        has = caps.cuda_int4_weight_only_kernel if device.type == "cuda" else caps.int4_weight_only_kernel
        if not has:
            kernel = ("torch._weight_int4pack_mm on an sm80+ GPU" if device.type == "cuda"
                      else "torch._weight_int4pack_mm_for_cpu")
            raise LoadError(f"quantization 'int4wo' needs {kernel}, which this machine lacks; "
                            "pick int8wo, or nf4 (bitsandbytes)")
    shapes = {(lin.in_features, lin.out_features): attr
              for _, attr, lin in quantizable_linears(base.model, include_lm_head=include_lm_head)}
    # Refused, not built with the misfits left unquantized: a variant named int4wo whose largest layers
    # stayed bf16 would be measured and compared as if it were 4-bit (SmolLM2's 576-wide inputs are all
    # but its down projection).
    misfits = [(f"{attr} {k} -> {n}", rule) for (k, n), attr in shapes.items()
               if (rule := shape_rule(method, device.type, k, n))]
    if misfits:
        raise LoadError(f"quantization {method!r} cannot run on {device.type} with this model: {misfits[0][1]}, and "
                        f"{', '.join(m for m, _ in misfits)} {'is' if len(misfits) == 1 else 'are'} not. Try int8wo.")


def device_caveat(name: str, device) -> str | None:
    """What variant `name` costs on `device` that its name does not say (None: nothing)."""
    method, head = split_name(name)
    if torch.device(device).type == "cuda" and "int8wo" in (method, head):
        return INT8_CUDA_CAVEAT
    return None


def describe(name: str, device) -> str:
    """The variant's description for engine info: METHODS[name], and its caveat on this device."""
    caveat = device_caveat(name, device)
    return METHODS[name] + (f" ({caveat})" if caveat else "")
