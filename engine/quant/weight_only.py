"""Weight-only int8 / int4 linears: our kernels' layout and PyTorch's own, side by side.

Why torch's own kernels: they ship inside the torch we pin, so they need no extra package
(torchao, which wraps these same ops, is not installed here) and run on every CPU torch runs on.
Their activation dtype is the kernel's, not the model's: on CPU they are fast with bf16
activations even when the model is fp32 (on an AVX2-only CPU far faster than with fp32
activations: docs/quantization.md), so x is cast in and y cast back. Which dtype, and which of
ours and torch's serves a decode step, are decisions of the execution plan
(engine/runtime/plan.py: measured once per machine and cached); a layer is told its compute dtype
when it is built and holds the layouts that can serve. engine/quant/quantize.py builds variants.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import cpu_gemm
from engine.kernels.catalogue import ONEDNN_FLAG_LOCK
from engine.model.loaded import DTYPE_NAMES


@contextlib.contextmanager
def onednn_on():
    """Hold oneDNN on for a quantized matmul that needs it (bitsandbytes' int8 `torch._int_mm` is
    several times faster with it): oneDNN is on except inside engine/kernels/catalogue.py's bf16 one-row
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


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPE_NAMES.items()}[dtype]


class WeightOnlyLinear(nn.Module):
    """A Linear whose weights stay quantized and go straight into a weight-only kernel.

    Two layouts may be held: our AVX2 kernels' (`has_ours`: on CPU where they build,
    engine/kernels/cpu_gemm.py; products in fp32, `ours_product`) and torch's kernel's
    (`torch_product`, in `compute_dtype`: x is cast in, y cast back to x's dtype, so the rest of the
    model keeps its own dtype). Our forward runs the one the execution plan names
    (engine/kernels/catalogue.py); called as a module (inside the transformers forward) a layer
    takes ours where it holds it. Our kernels' copies of the weights are non-persistent buffers:
    derived, so `weight_bytes` counts the weights once.
    """

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None, compute_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features, self.compute_dtype = in_features, out_features, compute_dtype
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ours_product(x) if self.has_ours and x.device.type == "cpu" else self.torch_product(x)

    def ours_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T + b through our kernel (fp32 activations; a compiled graph calls this too)."""
        y = self._gemv(x.reshape(-1, self.in_features).float().contiguous()).to(x.dtype)
        return self._finish(y, x)

    def torch_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T + b through torch's kernel, in compute_dtype (oneDNN is on: only the catalogue's bf16
        one-row product switches it, for plain Linears)."""
        x2 = x.reshape(-1, self.in_features)
        y = self._matmul(x2 if x2.dtype == self.compute_dtype else x2.to(self.compute_dtype)).to(x.dtype)
        return self._finish(y, x)

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"compute_dtype={dtype_name(self.compute_dtype)}, ours={self.has_ours}")

    @property
    def has_ours(self) -> bool:
        """Whether this layer holds our kernel's layout (then the plan may send its products there)."""
        return "gemv_scale" in self._buffers

    @staticmethod
    def _ours_builds(requested: bool, device) -> bool:
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


class Int8WeightOnlyLinear(WeightOnlyLinear):
    """y = x @ (W_int8 * scale).T + b: int8 weights with one scale per output channel, through
    `torch._weight_int8pack_mm` on CPU, which reads the int8 weights directly: a decode step (memory-bound)
    moves a quarter of fp32's bytes, half of bf16's. On CUDA through `int8_dequant_matmul`."""

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 compute_dtype: torch.dtype, ours_layout: bool = True):
        super().__init__(weight_int8.shape[1], weight_int8.shape[0], bias, compute_dtype)
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale.to(compute_dtype))  # the kernel wants scales in x's dtype
        if self._ours_builds(ours_layout, weight_int8.device):  # ours reads the same int8 tensor, with fp32 scales
            self.register_buffer("gemv_scale", scale.float().contiguous(), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, compute_dtype: torch.dtype, keep_unpacked: bool = True,
                    ours_layout: bool = True) -> Int8WeightOnlyLinear:
        """`compute_dtype`: torch's kernel's activation dtype (the plan's decision); `ours_layout`: hold
        our kernel's layout too, where it builds."""
        q, scale = cpu_gemm.quantize_int8(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias, compute_dtype, ours_layout)

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


class Int4WeightOnlyLinear(WeightOnlyLinear):
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
        for name, t in zip(("gemv_weight", "gemv_scale", "gemv_offset"), layout or ()):
            self.register_buffer(name, t, persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, compute_dtype: torch.dtype, group_size: int = INT4_GROUP_SIZE,
                    keep_unpacked: bool = False, ours_layout: bool = True) -> Int4WeightOnlyLinear:
        """As Int8WeightOnlyLinear.from_linear."""
        w = linear.weight.detach()
        q, sz = int4_quantize(w, group_size)
        if w.device.type == "cuda":  # the CUDA packer takes two 4-bit values per byte
            packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8),
                                                       INT4_CUDA_INNER_K_TILES)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)  # inner-k tiles: unused on CPU
        bias = None if linear.bias is None else linear.bias.detach().clone()
        layer = cls(packed, sz, w.shape[1], group_size, bias, compute_dtype)
        layer._q = q if keep_unpacked else None
        if cls._ours_builds(ours_layout, w.device):
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
