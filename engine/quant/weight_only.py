"""Weight-only int8 / int4 linears through PyTorch's own kernels, and the one-time choice of
their activation dtype.

Why torch's own kernels: they ship inside the torch we pin, so they need no extra package
(torchao, which wraps these same ops, is not installed here) and run on every CPU torch runs on.
Their activation dtype is the kernel's, not the model's: on CPU they are fast with bf16
activations even when the model is fp32 (on an AVX2-only CPU far faster than with fp32
activations: docs/quantization.md), so x is cast in and y cast back;
`weight_only_compute_dtype` measures that once per process (capabilities
`weight_only_activations` forces a choice). engine/quant/quantize.py builds variants from these.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.errors import LoadError
from engine.kernels import cpu_gemm, cpu_qdot
from engine.kernels.choose import ONEDNN_FLAG_LOCK
from engine.platform import capabilities
from engine.model.loaded import DTYPE_NAMES, first_line


@contextlib.contextmanager
def onednn_on():
    """Hold oneDNN on for a quantized matmul that needs it (bitsandbytes' int8 `torch._int_mm` is
    several times faster with it): oneDNN is on except inside engine/kernels/choose.py's bf16 one-row
    product, which switches the process-wide flag under ONEDNN_FLAG_LOCK; taking that lock here waits
    such a product out (another thread's), so the flag is on for this block."""
    with ONEDNN_FLAG_LOCK:
        if torch._C._get_mkldnn_enabled():
            yield
            return
        torch._C._set_mkldnn_enabled(True)  # the lock's own thread switched it off around this call
        try:
            yield
        finally:
            torch._C._set_mkldnn_enabled(False)



INT4_GROUP_SIZE = 32  # input weights per scale+zero; 32 vs 64 measured in docs/quantization.md
INT4_CUDA_INNER_K_TILES = 8  # the CUDA kernel's (tinygemm) layout: in_features % (16 * this) == 0
_PROBE = (576, 1536)  # in, out features of the CPU's one-time dtype race: a SmolLM2-sized projection
_PROBE_ROUNDS = 7
PROBE_MARGIN = 1.2  # bf16 activations only if their kernel is at least this much faster (they cost precision)
probe_results: dict = {}  # (kernel, device type, dtype name) -> median µs of one probe matmul, or the error


def shape_rule(kernel: str, device_type: str, in_features: int, out_features: int) -> str | None:
    """Why torch's `kernel` ('int8wo' / 'int4wo') on `device_type` cannot take a Linear of this shape
    (None: it can). int4: a scale and zero per INT4_GROUP_SIZE inputs, and on CUDA the packer
    (`torch._convert_weight_to_int4pack`, tinygemm's layout) tiles the inputs by 16 x
    INT4_CUDA_INNER_K_TILES and the outputs by 8. int8 has no rule: one scale per output row."""
    if kernel != "int4wo":
        return None
    if device_type == "cuda":
        k_tile = 16 * INT4_CUDA_INNER_K_TILES
        if in_features % k_tile or in_features % INT4_GROUP_SIZE or out_features % 8:
            return (f"torch's CUDA int4 kernel needs input sizes divisible by {k_tile} (its packer's 16 x "
                    f"{INT4_CUDA_INNER_K_TILES} inner k-tiles) and output sizes divisible by 8")
        return None
    if in_features % INT4_GROUP_SIZE:
        return f"the int4 kernel needs input sizes divisible by {INT4_GROUP_SIZE} (its group size)"
    return None


def weight_only_compute_dtype(kernel: str, device: torch.device, model_dtype: torch.dtype,
                              shapes: tuple[tuple[int, int], ...] | None = None) -> torch.dtype:
    """The activation dtype torch's `kernel` ('int8wo' or 'int4wo') runs in, for a model in `model_dtype`
    whose weight-only layers have `shapes` ((in, out) each; engine/quant/quantize.py passes the model's).

    CPU: bf16 or the model's dtype, whichever the kernel is faster in on this machine — measured once
    per process on _PROBE (`_probe`), unless capabilities `weight_only_activations` forces 'bf16' or
    'model'; the CPU kernels take any shape `shape_rule` allows. CUDA: the model's dtype for int8; bf16
    for int4 (the only one its kernel takes), checked on each of `shapes`: the packer's tile layout
    depends on the shape, so a probe of another shape says nothing (576 inputs, SmolLM2's, fail it).
    Raises LoadError if the kernel gives wrong results or fails in every candidate dtype.
    """
    device = torch.device(device)
    if device.type == "cuda":
        candidates = (torch.bfloat16,) if kernel == "int4wo" else (model_dtype,)
        probe_shapes = tuple(sorted(set(shapes))) if shapes else (_PROBE,)
    else:
        choice = capabilities.detect().weight_only_activations
        candidates = {"model": (model_dtype,), "bf16": (torch.bfloat16,)}.get(
            choice, tuple(dict.fromkeys((torch.bfloat16, model_dtype))))
        probe_shapes = (_PROBE,)
    return _probe(kernel, device.type, candidates, probe_shapes)


@functools.lru_cache(maxsize=None)
def _probe(kernel: str, device_type: str, candidates: tuple[torch.dtype, ...],
           shapes: tuple[tuple[int, int], ...] = (_PROBE,)) -> torch.dtype:
    """Run `kernel` on a probe layer of each of `shapes` in each candidate dtype: keep the dtypes whose
    results match the dequantized weights, and of those the fastest on the first shape (median over
    alternating rounds)."""
    cls = {"int8wo": Int8WeightOnlyLinear, "int4wo": Int4WeightOnlyLinear}[kernel]
    gen = torch.Generator().manual_seed(0)
    layers, errors = {}, {}
    for dt in candidates:
        try:
            for k, n in reversed(shapes):  # the first last: it is the one timed below
                linear = nn.Linear(k, n, bias=False)
                linear.weight.data = (torch.randn(n, k, generator=gen) * 0.02).to(device_type)
                x = torch.randn(1, k, generator=gen).to(device_type)
                layer = cls.from_linear(linear, compute_dtype=dt, keep_unpacked=True, gemv=False)  # torch's kernel
                want = x @ layer.dequantized().T
                got = layer(x).float()
                err = float((got - want).abs().max() / want.abs().max())
                if not err < 0.05:  # bf16 activations: ~1e-2 relative; a broken kernel: far more (or NaN)
                    raise RuntimeError(f"wrong results on {k} -> {n} (relative error {err:.2g})")
            layers[dt] = layer
        except Exception as exc:
            errors[dt] = f"{type(exc).__name__}: {first_line(exc)}"
            probe_results[(kernel, device_type, dtype_name(dt))] = errors[dt]
    if not layers:
        raise LoadError(f"torch's {kernel} kernel cannot run on this {device_type} ("
                        + "; ".join(f"{dtype_name(d)}: {e}" for d, e in errors.items())
                        + "); pick int8 or nf4 (bitsandbytes) or an unquantized dtype")
    if len(layers) == 1:
        return next(iter(layers))
    from engine.core import clock  # (not at the top: a small diff in a file others edit)

    times = {dt: [] for dt in layers}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared, busy CPU a second thread mostly measures its waits
    try:
        with torch.inference_mode():
            for _ in range(_PROBE_ROUNDS):  # alternate, so both dtypes see the same machine state
                for dt, layer in layers.items():
                    layer(x)
                    t0 = clock.done_s(x)
                    layer(x)
                    times[dt].append(clock.done_s(x) - t0)
    finally:
        torch.set_num_threads(threads)
    best = {dt: min(ts) for dt, ts in times.items()}  # the least disturbed run: other load only adds
    for dt, t in best.items():
        probe_results[(kernel, device_type, dtype_name(dt))] = round(t * 1e6, 1)
    first, *others = layers  # the first candidate (bf16) only where it clearly wins: a tie keeps precision
    rest = min(others, key=best.get) if others else None
    return first if rest is None or best[first] * PROBE_MARGIN < best[rest] else rest



KERNELS_MARGIN = 1.1  # torch's kernels only where a step through them is this much faster: ours are more precise (fp32 or int16 activations)


def choose_kernels(model: nn.Module, cache_dir=None, rounds: int = 3, steps: int = 2) -> dict | None:
    """Where `model`'s weight-only layers hold both our kernels' layout and torch's (CPU, our Llama
    forward), the faster of the two for a decode step (ours on a tie, within KERNELS_MARGIN), set on
    every layer. Why measured: the order depends on the CPU (`python -m engine.bench gemv` prints
    both at each row count; on AVX2 ours won both, on AVX-512 torch's 4-bit kernel beat ours:
    docs/quantization.md). Why cached per machine in `cache_dir` (engine/kernels/plan.py `cached`):
    the two sum in different orders, so a race run again at each start could change the bits of a
    restart. Returns the decision, kept on the model for `decode_kernels` (None: nothing to choose)."""
    from engine.kernels import plan  # (plan does not import this module)
    from engine.model.fast_llama import FastLlama  # (fast_llama does not import this module)

    layers = [m for m in model.modules() if isinstance(m, _WeightOnlyLinear) and m.has_ours]
    if not layers or not isinstance(model, FastLlama):
        return None
    kinds = sorted({f"{type(m).__name__}:{m.in_features}x{m.out_features}:{m.compute_dtype}" for m in layers})
    key = {**plan.machine_key(model), "weight_only": kinds, "layers": len(layers)}
    decision, source = plan.cached(cache_dir, "weight-only-kernels", key,
                                   lambda: _race(model, layers, rounds, steps),
                                   valid=lambda d: d.get("kernels") in ("ours", "torch"))
    for m in layers:
        m.gemv = decision["kernels"] == "ours"
    model.weight_only_kernels = {**decision, "source": source}
    return model.weight_only_kernels


@torch.inference_mode()
def _race(model, layers, rounds: int, steps: int) -> dict:
    """A decode step through our kernels and through torch's, alternating (paired per round: a
    neighbour's load slows both); round 0 warms both up and is dropped."""
    prompt = 16
    cache = model.new_cache(prompt + steps + 2)
    model.forward(torch.arange(prompt, device=model.device) % model.vocab_size, cache)
    times = {True: [], False: []}
    for r in range(rounds + 1):
        for ours in times:
            for m in layers:
                m.gemv = ours
            cache.crop(prompt)
            t0 = time.perf_counter()
            for _ in range(steps):
                model.forward(torch.tensor([7], device=model.device), cache)
            if r:
                times[ours].append((time.perf_counter() - t0) / steps)
    torch_over_ours = statistics.median(t / o for o, t in zip(times[True], times[False]))
    return {"kernels": "ours" if torch_over_ours * KERNELS_MARGIN >= 1.0 else "torch",
            **{f"{k}_ms": round(statistics.median(times[v]) * 1e3, 2) for k, v in (("ours", True), ("torch", False))}}


def decode_kernels(model: nn.Module) -> str | None:
    """What `model`'s weight-only layers decode with, for engine info (None: it has none)."""
    layers = [m for m in model.modules() if isinstance(m, _WeightOnlyLinear)]
    if not layers:
        return None
    if any(getattr(m, "int8_activations", False) for m in layers):  # engine/quant/w8a.py
        forms = dict.fromkeys(m.isa for m in layers if getattr(m, "int8_activations", False))
        return ("int8 activations per block of 32: " + "; ".join(
            f"our integer kernels, {i}: {cpu_qdot.ISAS[i][2]}" if i else cpu_qdot.REFERENCE for i in forms)
            + " (engine/kernels/cpu_qdot.py)")
    if all(m.gemv for m in layers):
        return cpu_gemm.NAME
    chosen = getattr(model, "weight_only_kernels", None)
    if chosen and chosen["kernels"] == "torch" and all(m.has_ours for m in layers):
        return (f"torch's weight-only kernels: a decode step measured faster through them here "
                f"({chosen['torch_ms']} ms against ours {chosen['ours_ms']} ms; {chosen['source']})")
    on_cpu = next(layers[0].buffers()).device.type == "cpu"
    if not on_cpu and any(isinstance(m, Int8WeightOnlyLinear) for m in layers):
        return f"int8: F.linear over the weights cast to the activations' dtype (gpt-fast's form); {INT8_CUDA_CAVEAT}"
    why = (cpu_gemm.unavailable_reason() if on_cpu else "they run on CPU only") or "a layer's shape"
    return f"torch's weight-only kernels; ours not used: {why}"


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPE_NAMES.items()}[dtype]


class _WeightOnlyLinear(nn.Module):
    """A Linear whose weights stay quantized and go straight into a weight-only kernel.

    On CPU where our AVX2 kernels run (`gemv` is True; engine/kernels/cpu_gemm.py), every product goes
    to them, in fp32 (on AVX2 faster than torch's at every row count `python -m engine.bench gemv`
    measures: docs/quantization.md; a variant keeps them only where its decode step measured faster
    through them: `choose_kernels`). Otherwise torch's kernel in `compute_dtype` (see
    `weight_only_compute_dtype`): x is cast in, y cast back to x's dtype, so the rest of the model
    keeps its own dtype. Our kernels' copies of the weights are non-persistent buffers: derived, so
    `weight_bytes` counts the weights once.
    """

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None, compute_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features, self.compute_dtype = in_features, out_features, compute_dtype
        self.register_buffer("bias", bias)
        self.gemv = False  # set by a subclass that holds our kernel's layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.compute(x)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """forward (oneDNN is on: only engine/kernels/choose.py's bf16 one-row product switches it, for
        plain Linears; a compiled graph calls this name)."""
        x2 = x.reshape(-1, self.in_features)
        if self.gemv and x2.device.type == "cpu":
            y = self._gemv(x2.float().contiguous()).to(x.dtype)
        else:
            y = self._matmul(x2 if x2.dtype == self.compute_dtype else x2.to(self.compute_dtype)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"compute_dtype={dtype_name(self.compute_dtype)}, gemv={self.gemv}")

    @property
    def has_ours(self) -> bool:
        """Whether this layer holds our kernel's layout (then `gemv` may switch between the two)."""
        return "gemv_scale" in self._buffers

    @staticmethod
    def _use_gemv(requested: bool, device) -> bool:
        return requested and torch.device(device).type == "cpu" and cpu_gemm.available()


INT8_CUDA_CAVEAT = ("on CUDA it pays only with the Compiled step: eager, each layer casts its int8 weights to a "
                    "full copy in the activations' dtype before the matmul (more bytes than the unquantized model); "
                    "torch.compile fuses the cast into the matmul, which then reads int8")


def int8_dequant_matmul(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x @ (W_int8 * scale).T as gpt-fast writes it on CUDA: F.linear(x, W_int8.to(x.dtype)) * scale.
    Why not `torch._weight_int8pack_mm` there: on CUDA it is a naive kernel (a thread per output,
    uncoalesced loads), several times slower than a bf16 matmul; this form is a cast and a cuBLAS
    matmul eagerly (INT8_CUDA_CAVEAT), and one kernel reading the int8 weights once torch.compile
    fuses the cast into it. The scale is per output row, so it factors out of the sum."""
    return F.linear(x, weight_int8.to(x.dtype)) * scale


class Int8WeightOnlyLinear(_WeightOnlyLinear):
    """y = x @ (W_int8 * scale).T + b: int8 weights with one scale per output channel, through
    `torch._weight_int8pack_mm` on CPU, which reads the int8 weights directly: a decode step (memory-bound)
    moves a quarter of fp32's bytes, half of bf16's. On CUDA through `int8_dequant_matmul`."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype, gemv: bool = True):
        super().__init__(weight_int8.shape[1], weight_int8.shape[0], bias, compute_dtype)
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale.to(compute_dtype))  # the kernel wants scales in x's dtype
        self.gemv = self._use_gemv(gemv, weight_int8.device)
        if self.gemv:  # ours reads the same int8 tensor, with fp32 scales
            self.register_buffer("gemv_scale", scale.float().contiguous(), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "int8wo", device=None, dtype=None,
                    compute_dtype: torch.dtype | None = None, keep_unpacked: bool = True,
                    gemv: bool = True) -> Int8WeightOnlyLinear:
        q, scale = cpu_gemm.quantize_int8(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        compute = compute_dtype or weight_only_compute_dtype("int8wo", q.device, linear.weight.dtype,
                                                             ((linear.in_features, linear.out_features),))
        return cls(q, scale, bias, compute, gemv)

    def _matmul(self, x):
        if x.device.type == "cuda":
            return int8_dequant_matmul(x, self.weight_int8, self.scale)
        return torch._weight_int8pack_mm(x, self.weight_int8, self.scale)

    def _gemv(self, x):
        return cpu_gemm.int8_gemv(x, self.weight_int8, self.gemv_scale)

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

    def _add_gemv_layout(self, q: torch.Tensor, scales_and_zeros: torch.Tensor) -> None:
        """Our kernel's copy of the weights (fp16 scales, from the fp32 ones), where it can run."""
        layout = cpu_gemm.pack_int4(q, scales_and_zeros[..., 0].T, scales_and_zeros[..., 1].T) \
            if self.group_size == cpu_gemm.GROUP else None
        self.gemv = layout is not None
        for name, t in zip(("gemv_weight", "gemv_scale", "gemv_offset"), layout or ()):
            self.register_buffer(name, t, persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, name: str = "int4wo", device=None, dtype=None,
                    compute_dtype: torch.dtype | None = None, group_size: int = INT4_GROUP_SIZE,
                    keep_unpacked: bool = False, gemv: bool = True) -> Int4WeightOnlyLinear:
        w = linear.weight.detach()
        q, sz = int4_quantize(w, group_size)
        if w.device.type == "cuda":  # the CUDA packer takes two 4-bit values per byte
            packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8),
                                                       INT4_CUDA_INNER_K_TILES)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)  # inner-k tiles: unused on CPU
        bias = None if linear.bias is None else linear.bias.detach().clone()
        compute = compute_dtype or weight_only_compute_dtype("int4wo", w.device, w.dtype, ((w.shape[1], w.shape[0]),))
        layer = cls(packed, sz, w.shape[1], group_size, bias, compute)
        layer._q = q if keep_unpacked else None
        if cls._use_gemv(gemv, w.device):
            layer._add_gemv_layout(q, sz)
        return layer

    def _matmul(self, x):
        if x.device.type == "cuda":
            return torch._weight_int4pack_mm(x, self.weight_int4, self.group_size, self.scales_and_zeros)
        return torch._weight_int4pack_mm_for_cpu(x, self.weight_int4, self.group_size, self.scales_and_zeros)

    def _gemv(self, x):
        return cpu_gemm.int4_gemv(x, self.gemv_weight, self.gemv_scale, self.gemv_offset)

    def dequantized(self) -> torch.Tensor:
        if self._q is None:
            raise ValueError("built without keep_unpacked=True: the packed layout is the kernel's own")
        sz = self.scales_and_zeros.float()
        scale, zero = sz[..., 0].T.repeat_interleave(self.group_size, 1), sz[..., 1].T.repeat_interleave(self.group_size, 1)
        return (self._q.float() - 8) * scale + zero
