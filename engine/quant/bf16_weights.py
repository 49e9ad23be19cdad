"""bf16wo: the weights kept in bf16, every product and activation in fp32.

A decode step streams every weight once, so its time is about the weights' bytes over the memory's
speed, and bf16 weights halve those bytes. The `bf16` variant halves them too, but it casts the whole
model: its activations, norms, residual stream and KV cache are rounded to bf16 at every op, as torch
computes a bf16 model, and on CPU its layers run the Python loop (the C++ layer loop runs fp32
activations). `bf16wo` rounds the weights alone, once: our panel kernel widens each bf16 weight exactly
(a shift) and sums in the fp32 kernel's order (engine/kernels/cpu_gemm.py `fp32_mm`), so a product is
the fp32 product of the rounded weights, and the layers run the C++ loop as fp32 ones do. Its only
error is the weights' rounding (relative 2^-9), measured like every variant's (`python -m engine.bench
quant`), never assumed.

CPU only (the panels are our CPU kernel's); over a model loaded in bf16 it is refused (its weights are
bf16 already, and its activations too: load fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bf16WeightLinear(nn.Linear):
    """A Linear whose weight is bf16 and whose products are fp32. `bf16_weights`: how the kernels, which
    sit below engine/quant, know it (engine/kernels/cpu_gemm.py `fp32_rows`); the execution plan sends its
    rows to our panel kernel over its bf16 panels (catalogue `OURS_BF16W`), a long prompt's to `forward`."""

    bf16_weights = True

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Bf16WeightLinear:
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16).contiguous(), requires_grad=False)
        layer.register_parameter("bias", linear.bias)  # fp32 (or None), shared with the loaded model
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reference, and the plan's kernel for more rows than ours serves: the weights widened exactly,
        then the product in x's dtype (fp32: MKL's GEMM)."""
        return F.linear(x, self.weight.to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights=bf16, products=fp32"
