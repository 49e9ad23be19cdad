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

Why torch's own kernels for the weight-only variants: they ship inside the torch we pin, so they
need no extra package (torchao, which wraps these same ops, is not installed here) and run on
every CPU torch runs on. Their activation dtype is the kernel's, not the model's: on CPU they are
fast with bf16 activations even when the model is fp32 (measured on the Zen 3, AVX2 only: one
decode step's matmuls 6.7 ms with bf16 activations, 66.5 ms with fp32), so x is cast in and y cast
back; `weight_only_compute_dtype` measures that once per process (capabilities
`weight_only_activations` forces a choice).

What is quantized: every `nn.Linear` of the transformer blocks (our fused q/k/v, o, fused
gate/up, down; or the generic model's projections). Not the token embedding, nor the norms.
SmolLM2 ties `lm_head` to the embedding (one 49,152 x 576 matrix, 21% of its weights): the plain
variants leave it tied and unquantized; the `+head` variants give `lm_head` its own quantized copy
(the embedding lookup keeps reading the original), which adds that copy's bytes to the total but
cuts the bytes a decode step reads: a step reads all of lm_head and one row of the embedding.
`python -m engine.bench quant` measures both (docs/quantization.md).

A variant shares every tensor it does not quantize with the loaded model (embedding, norms,
rotary tables), so holding several variants costs only their quantized layers. After building,
a short forward runs (the loader's warm-up), so a method the device or the model's layer shapes
cannot run fails here with one `LoadError`, never in the middle of a request.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import logging
import sys
import time
from dataclasses import replace

import torch
from torch import nn

from . import capabilities
from .errors import InvalidRequest, LoadError
from .model import DTYPE_NAMES, LoadedModel, first_line, warm_up

QUANTIZED = {
    "int8": "bitsandbytes LLM.int8 (int8 weights; int8 activations, outliers > 6 in fp16)",
    "nf4": "bitsandbytes 4-bit NormalFloat (blocks of 64), compute in the model dtype",
    "fp4": "bitsandbytes 4-bit float (blocks of 64), compute in the model dtype",
    "int8wo": "int8 weights per output channel (torch._weight_int8pack_mm), activations in its fast dtype",
    "int8wo+head": "int8wo with lm_head quantized too (its own int8 copy; the embedding stays)",
    "int4wo": "4-bit weights, scale+zero per group of 32 (torch._weight_int4pack_mm), activations in its fast dtype",
    "int4wo+head": "int4wo with lm_head quantized too (its own 4-bit copy; the embedding stays)",
}
WEIGHT_ONLY = ("int8wo", "int4wo")  # torch's own kernels (below)
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
    method, head = _split(name)
    quantize_lm_head = quantize_lm_head or head
    t0 = time.perf_counter()
    extra = ""
    if method in DTYPE_NAMES:
        model = _cast(base, DTYPE_NAMES[method])
        dtype = DTYPE_NAMES[method]
    else:
        if method in WEIGHT_ONLY:  # refused here, before building, if its kernel is missing
            extra = f" (here: {_dtype_name(_check_weight_only(method, base, quantize_lm_head))})"
        model = _quantized(base, method, quantize_lm_head)
        dtype = base.dtype
    try:
        warm_up(model)  # a short prefill and a decode step: kernels and shapes are checked here
    except Exception as exc:
        raise LoadError(f"quantization {name!r} cannot run on {base.device} with this model: "
                        f"{type(exc).__name__}: {first_line(exc)}") from exc
    note = f"variant {name}: {METHODS[name]}{extra}" + (" (lm_head quantized, untied)" if quantize_lm_head else "")
    return replace(base, model=model, dtype=dtype, load_s=time.perf_counter() - t0, notes=[*base.notes, note])


def precheck(base: LoadedModel, name: str) -> str | None:
    """Why variant `name` cannot run here, known without building it (None: nothing known against it).
    The page shows such a variant disabled with this reason; building may still fail (then the
    VariantSet remembers that reason)."""
    method, head = _split(name)
    try:
        if method in DTYPE_NAMES:
            if DTYPE_NAMES[method].itemsize > base.dtype.itemsize:
                _cast(base, DTYPE_NAMES[method])  # raises the upcast's reason
        elif method in WEIGHT_ONLY:
            _check_weight_only(method, base, head)
        else:
            _check_bitsandbytes(method, base)
    except LoadError as exc:
        return str(exc)
    return None


def _split(name: str) -> tuple[str, bool]:
    """'int8wo+head' -> ('int8wo', True)."""
    method, plus, rest = name.partition("+")
    return method, plus == "+" and rest == "head"


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
    if name not in WEIGHT_ONLY:
        _check_bitsandbytes(name, base)
    # New module objects that share every tensor with the base; the linears are then replaced.
    src = base.model
    model = copy.deepcopy(src, memo={id(t): t for t in itertools.chain(src.parameters(), src.buffers())})
    build = {"int8": _bnb_int8, "nf4": _bnb_4bit, "fp4": _bnb_4bit, "int8wo": Int8WeightOnlyLinear.from_linear,
             "int4wo": Int4WeightOnlyLinear.from_linear}[name]
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
    unusable = capabilities.detect().bnb_unusable
    if unusable:  # checked before any import: on such a CPU importing it kills the process
        raise LoadError(f"quantization {name!r}: {unusable} Try int8wo or int4wo (torch's own kernels).")
    try:
        _import_bitsandbytes()
    except Exception as exc:
        raise LoadError(f"quantization {name!r} needs bitsandbytes, which failed to load: "
                        f"{type(exc).__name__}: {first_line(exc)}") from exc
    if name in ("nf4", "fp4") and base.device.type == "cpu" and capabilities.detect().bnb_cpu_avx512bf16:
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


# --- weight-only int8 / int4 through torch's own kernels -------------------------------------------
INT4_GROUP_SIZE = 32  # input weights per scale+zero; 32 vs 64 measured in docs/quantization.md
INT4_CUDA_INNER_K_TILES = 8  # the CUDA kernel's (tinygemm) layout: in_features % (16 * this) == 0
_PROBE = (576, 1536)  # in, out features of the one-time kernel check: a SmolLM2-sized projection
_PROBE_ROUNDS = 7
PROBE_MARGIN = 1.2  # bf16 activations only if their kernel is at least this much faster (they cost precision)
probe_results: dict = {}  # (kernel, device type, dtype name) -> median µs of one probe matmul, or the error


def weight_only_compute_dtype(kernel: str, device: torch.device, model_dtype: torch.dtype) -> torch.dtype:
    """The activation dtype torch's `kernel` ('int8wo' or 'int4wo') runs in, for a model in `model_dtype`.

    CPU: bf16 or the model's dtype, whichever the kernel is faster in on this machine — measured once
    per process (`_probe`), unless capabilities `weight_only_activations` forces 'bf16' or 'model'.
    CUDA: the model's dtype for int8; bf16 for int4 (the only one its kernel takes). Raises
    LoadError if the kernel gives wrong results or fails in every candidate dtype.
    """
    device = torch.device(device)
    if device.type == "cuda":
        candidates = (torch.bfloat16,) if kernel == "int4wo" else (model_dtype,)
    else:
        choice = capabilities.detect().weight_only_activations
        candidates = {"model": (model_dtype,), "bf16": (torch.bfloat16,)}.get(
            choice, tuple(dict.fromkeys((torch.bfloat16, model_dtype))))
    return _probe(kernel, device.type, candidates)


@functools.lru_cache(maxsize=None)
def _probe(kernel: str, device_type: str, candidates: tuple[torch.dtype, ...]) -> torch.dtype:
    """Run `kernel` on a probe layer in each candidate dtype: keep those whose result matches the
    dequantized weights, and of those the fastest (median over alternating rounds)."""
    cls = {"int8wo": Int8WeightOnlyLinear, "int4wo": Int4WeightOnlyLinear}[kernel]
    gen = torch.Generator().manual_seed(0)
    k, n = _PROBE
    linear = nn.Linear(k, n, bias=False)
    linear.weight.data = (torch.randn(n, k, generator=gen) * 0.02).to(device_type)
    x = torch.randn(1, k, generator=gen).to(device_type)
    layers, errors = {}, {}
    for dt in candidates:
        try:
            layer = cls.from_linear(linear, compute_dtype=dt, keep_unpacked=True)
            want = x @ layer.dequantized().T
            got = layer(x).float()
            err = float((got - want).abs().max() / want.abs().max())
            if not err < 0.05:  # bf16 activations: ~1e-2 relative; a broken kernel: far more (or NaN)
                raise RuntimeError(f"wrong results (relative error {err:.2g})")
            layers[dt] = layer
        except Exception as exc:
            errors[dt] = f"{type(exc).__name__}: {first_line(exc)}"
            probe_results[(kernel, device_type, _dtype_name(dt))] = errors[dt]
    if not layers:
        raise LoadError(f"torch's {kernel} kernel cannot run on this {device_type} ("
                        + "; ".join(f"{_dtype_name(d)}: {e}" for d, e in errors.items())
                        + "); pick int8 or nf4 (bitsandbytes) or an unquantized dtype")
    if len(layers) == 1:
        return next(iter(layers))
    times = {dt: [] for dt in layers}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared, busy CPU a second thread mostly measures its waits
    try:
        with torch.inference_mode():
            for _ in range(_PROBE_ROUNDS):  # alternate, so both dtypes see the same machine state
                for dt, layer in layers.items():
                    layer(x)
                    t0 = time.perf_counter()
                    layer(x)
                    if device_type == "cuda":
                        torch.cuda.synchronize()
                    times[dt].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    best = {dt: min(ts) for dt, ts in times.items()}  # the least disturbed run: other load only adds
    for dt, t in best.items():
        probe_results[(kernel, device_type, _dtype_name(dt))] = round(t * 1e6, 1)
    first, *others = layers  # the first candidate (bf16) only where it clearly wins: a tie keeps precision
    rest = min(others, key=best.get) if others else None
    return first if rest is None or best[first] * PROBE_MARGIN < best[rest] else rest


def _check_weight_only(method: str, base: LoadedModel, include_lm_head: bool) -> torch.dtype:
    """Refuse, before building, a weight-only variant whose kernel or layer shapes this machine lacks.
    Returns the activation dtype its kernel will run in."""
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
        multiple = INT4_GROUP_SIZE if device.type == "cpu" else max(INT4_GROUP_SIZE, 16 * INT4_CUDA_INNER_K_TILES)
        for _, attr, lin in quantizable_linears(base.model, include_lm_head=include_lm_head):
            if lin.in_features % multiple or (device.type == "cuda" and lin.out_features % 8):
                raise LoadError(f"quantization 'int4wo' cannot run with this model: its kernel needs input sizes "
                                f"divisible by {multiple}, and {attr} is {lin.in_features} -> {lin.out_features}. "
                                "Try int8wo.")
    return weight_only_compute_dtype(method, device, base.dtype)


class _WeightOnlyLinear(nn.Module):
    """A Linear whose weights stay quantized and go straight into one of torch's weight-only kernels.

    The kernel runs in `compute_dtype` (see `weight_only_compute_dtype`): x is cast in, y cast back
    to x's dtype, so the rest of the model keeps its own dtype.
    """

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None, compute_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features, self.compute_dtype = in_features, out_features, compute_dtype
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != self.compute_dtype:
            x2 = x2.to(self.compute_dtype)
        with _onednn():
            y = self._matmul(x2)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"compute_dtype={_dtype_name(self.compute_dtype)}")


class Int8WeightOnlyLinear(_WeightOnlyLinear):
    """y = x @ (W_int8 * scale).T + b: int8 weights with one scale per output channel, through
    `torch._weight_int8pack_mm`, which reads the int8 weights directly: a decode step (memory-bound)
    moves a quarter of fp32's bytes, half of bf16's."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype):
        super().__init__(weight_int8.shape[1], weight_int8.shape[0], bias, compute_dtype)
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale.to(compute_dtype))  # the kernel wants scales in x's dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "int8wo", device=None, dtype=None,
                    compute_dtype: torch.dtype | None = None, keep_unpacked: bool = True) -> Int8WeightOnlyLinear:
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        compute = compute_dtype or weight_only_compute_dtype("int8wo", w.device, linear.weight.dtype)
        return cls(q, scale, bias, compute)

    def _matmul(self, x):
        return torch._weight_int8pack_mm(x, self.weight_int8, self.scale)

    def dequantized(self) -> torch.Tensor:
        return self.weight_int8.float() * self.scale.float()[:, None]


def int4_quantize(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit groups along the input dimension, in the layout torch's int4 kernels expect:
    q in 0..15 (int32, [out, in]) and scales_and_zeros [in / group, out, 2] with
    w ≈ (q - 8) * scale + zero (the zero is a float offset: the group's min plus 8 scales)."""
    n, k = w.shape
    groups = w.float().reshape(-1, group_size)
    lo, hi = groups.amin(dim=1, keepdim=True), groups.amax(dim=1, keepdim=True)
    scale = (hi - lo).clamp(min=1e-6) / 15
    zero = lo + 8 * scale
    q = groups.sub(lo).div(scale).round().clamp_(0, 15).to(torch.int32).reshape(n, k)
    scales_and_zeros = torch.stack([scale.view(n, -1), zero.view(n, -1)], dim=2).transpose(0, 1).contiguous()
    return q, scales_and_zeros


class Int4WeightOnlyLinear(_WeightOnlyLinear):
    """4-bit weights, a scale and a zero per group of `group_size` input weights, through torch's
    `_weight_int4pack_mm_for_cpu` (CPU) or `_weight_int4pack_mm` (CUDA), which unpack them in the
    kernel. Half a byte per weight plus 4 bytes (bf16 scale, zero) per group."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int,
                 group_size: int, bias: torch.Tensor | None, compute_dtype: torch.dtype):
        super().__init__(in_features, scales_and_zeros.shape[1], bias, compute_dtype)
        self.group_size = group_size
        self.register_buffer("weight_int4", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(compute_dtype))
        self._q = None  # the unpacked values, kept only by tests that ask for `dequantized`

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "int4wo", device=None, dtype=None,
                    compute_dtype: torch.dtype | None = None, group_size: int = INT4_GROUP_SIZE,
                    keep_unpacked: bool = False) -> Int4WeightOnlyLinear:
        w = linear.weight.detach()
        q, sz = int4_quantize(w, group_size)
        if w.device.type == "cuda":  # the CUDA packer takes two 4-bit values per byte
            packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8),
                                                       INT4_CUDA_INNER_K_TILES)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)  # inner-k tiles: unused on CPU
        bias = None if linear.bias is None else linear.bias.detach().clone()
        compute = compute_dtype or weight_only_compute_dtype("int4wo", w.device, w.dtype)
        layer = cls(packed, sz, w.shape[1], group_size, bias, compute)
        layer._q = q if keep_unpacked else None
        return layer

    def _matmul(self, x):
        if x.device.type == "cuda":
            return torch._weight_int4pack_mm(x, self.weight_int4, self.group_size, self.scales_and_zeros)
        return torch._weight_int4pack_mm_for_cpu(x, self.weight_int4, self.group_size, self.scales_and_zeros)

    def dequantized(self) -> torch.Tensor:
        if self._q is None:
            raise ValueError("built without keep_unpacked=True: the packed layout is the kernel's own")
        sz = self.scales_and_zeros.float()
        scale, zero = sz[..., 0].T.repeat_interleave(self.group_size, 1), sz[..., 1].T.repeat_interleave(self.group_size, 1)
        return (self._q.float() - 8) * scale + zero


