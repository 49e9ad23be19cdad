"""Weight-only layers whose products quantize the activations to int8 per block of 32 (the `int8w8a`
and `int4w8a` variants, engine/quant/quantize.py): integer dot products, engine/kernels/cpu_qdot.py.

The execution plan (engine/runtime/plan.py) chooses everything about their products: the kernel, from
the layer's `int8_activations` mark (`WO_INT8ACT` for every row count where our kernels run in a form;
under the torch reference, for a sequence's rows up to OURS_ROWS, `WO_DEQUANT_FP32`, the fp32 GEMM over
dequantized weights, past them), and the form of our integer
kernels from the detected capabilities (`Plan.w8a_form`: 'avx512-vnni', 'avx-vnni', 'avx2', ..., or
None for the torch reference). The runner tells each layer that form (`tell`) before its first
forward; a layer never told runs the torch reference.

The weights are stored once, in the integer kernels' own layout (persistent buffers, so
`weight_bytes` counts them): int8 [N, K] with one fp32 scale per output channel (int8wo's
quantization); 4-bit, 16 bytes per block of 32 inputs and an fp16 scale and offset per block, 16
channels side by side (int4wo's quantization, cpu_qdot.pack_int4: no torch-packed copy beside it).
CPU only: on another device the variant is refused before it is built (`check`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.errors import LoadError
from engine.kernels import cpu_gemm, cpu_qdot
from engine.platform import hugepages
from engine.quant.weight_only import INT4_GROUP_SIZE, WeightOnlyLinear, int4_quantize


def check(device, shapes) -> None:
    """Refuse a w8a variant this device or these (in, out) shapes cannot run, before building it."""
    if torch.device(device).type != "cpu":
        raise LoadError(f"the int8-activation variants (int8w8a, int4w8a) run on CPU only, not {device}; "
                        "pick int8wo or int4wo")
    odd = sorted({k for k, _ in shapes if k % cpu_qdot.BLOCK})
    if odd:
        raise LoadError(f"the int8-activation variants need input sizes divisible by {cpu_qdot.BLOCK} "
                        f"(their activation blocks); this model has {odd}. Pick int8wo.")


def tell(model: nn.Module, form: str | None, hardware_stream: tuple[int, ...] = ()) -> None:
    """Give every w8a layer of `model` the kernel form its execution plan chose and whether its kernels ask
    for the weights ahead: not where its KIND is in `hardware_stream` (engine/runtime/runner.py calls this with
    `Plan.w8a_form` and `Plan.w8a_hardware_stream`; form None: the torch reference)."""
    if form is not None and form not in cpu_qdot.ISAS:
        raise ValueError(f"unknown w8a kernel form {form!r}; forms: {', '.join(cpu_qdot.ISAS)}")
    for m in model.modules():
        if isinstance(m, _W8ALinear):
            m.isa, m.prefetch = form, m.KIND not in hardware_stream


def widen(model: nn.Module) -> None:
    """Give `model`'s floating tensors that are not fp32 (a bf16 or fp16 model's embedding, norms, rotary
    tables, an unquantized lm_head) fp32 copies, exact, ties kept; the tensors it shares with the model it
    was built from are replaced in this model's modules, never changed. Why: the w8a products compute in
    fp32 whatever comes in, and the C++ layer loop (engine/kernels/cpu_layers.cpp) runs fp32 activations
    only, so a w8a variant of a bf16 model ran the Python loop, ~3x slower a step
    (`python -m engine.bench bandwidth --dtype bf16 --variants int4w8a+head8`)."""
    wide: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for store in (m._parameters, m._buffers):
            for name, t in store.items():
                if t is None or not t.is_floating_point() or t.dtype == torch.float32:
                    continue
                if id(t) not in wide:
                    w = t.detach().float()
                    wide[id(t)] = nn.Parameter(w, requires_grad=False) if isinstance(t, nn.Parameter) else w
                store[name] = wide[id(t)]


def gather(model: nn.Module) -> None:
    """Move every w8a layer's weights (and scales) of `model` into one huge-page region
    (engine/platform/hugepages.py says why): the same values; a decode step streams them faster."""
    held = [(m, name) for m in model.modules() if isinstance(m, _W8ALinear) for name in m.WEIGHTS]
    if not held:
        return
    for (m, name), t in zip(held, hugepages.gather([m._buffers[name] for m, name in held])):
        m._buffers[name] = t


class _W8ALinear(WeightOnlyLinear):
    int8_activations = True  # the plan's mark: Kernel.WO_INT8ACT (engine/runtime/plan.py)

    def __init__(self, in_features, out_features, bias):
        super().__init__(in_features, out_features, bias, torch.float32)
        self.isa: str | None = None  # the plan's form, told by the runner (`tell`); None: the torch reference
        self.prefetch = True  # whether its kernels ask for the weights ahead (the plan's w8a_hardware_stream), told with it

    def ours_product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T + b through our integer kernels (x quantized to int8 per block of 32)."""
        return self._finish(self._gemv(x.reshape(-1, self.in_features).float().contiguous()).to(x.dtype), x)

    def normed_product(self, x: torch.Tensor, norm) -> torch.Tensor:
        """norm(x) @ W.T + b, `norm` an fp32 RMSNorm folded into the activations' quantizer (the plan's
        `head_norm`: the final norm and lm_head of a decode step, engine/runtime/eager.py): the same bits as
        ours_product(norm(x)), without the normed rows in memory nor a call per op. [rows, out] fp32."""
        x = x.reshape(-1, self.in_features).contiguous()
        return cpu_qdot.normed_w8a(x, norm.weight, norm.eps, *self.product_args())

    def product_args(self) -> tuple:
        """What our integer kernels' product reads of this layer: (weights, kind, bias, form, prefetch), as
        cpu_qdot.normed_w8a takes them; the C++ layer loop
        takes them too, for a decode step's head (engine/kernels/cpu_layers.py)."""
        return [self._buffers[n] for n in self.WEIGHTS], self.KIND, self.bias, self.isa, self.prefetch

    forward = ours_product  # its only layout is the integer kernels' (the transformers forward calls this)

    def _matmul(self, x):  # torch_product: the same integer kernels (there is no torch layout to run)
        return self._gemv(x.float().contiguous())

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        """x (many rows of one sequence: a long prompt) times the weights dequantized to fp32, in the fp32
        GEMM (F.linear: MKL), the dequantization paid once per call: the plan's `WO_DEQUANT_FP32`, where
        our integer kernels do not run (the torch reference would be far slower at that many rows); where
        they run they are faster at every row count (`python -m engine.bench gemv`: `dequant-fp32`)."""
        y = F.linear(x.float(), self.dequantized(), self.bias)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 activations, isa={self.isa}"


class Int8W8ALinear(_W8ALinear):
    """y = x @ (W_int8 * scale).T + b with x quantized to int8 per block of 32."""

    WEIGHTS = ("weight_int8", "scale")  # what a product reads (the C++ layer loop too)
    KIND = 1  # the integer kernels' code for these weights (cpu_qdot_ops.h product, cpu_layers.cpp)

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight_int8.shape[1], weight_int8.shape[0], bias)
        self.register_buffer("weight_int8", weight_int8.contiguous())
        self.register_buffer("scale", scale.float().contiguous())

    @classmethod
    def from_linear(cls, linear: nn.Linear, **_) -> Int8W8ALinear:
        q, scale = cpu_qdot.quantize_int8(linear.weight.detach())
        return cls(q, scale, None if linear.bias is None else linear.bias.detach().clone())

    def _gemv(self, x):
        return cpu_qdot.int8_w8a(x, self.weight_int8, self.scale, self.isa, self.prefetch)

    def dequantized(self) -> torch.Tensor:
        return cpu_qdot.dequantized(self.weight_int8, self.scale)


class Int4W8ALinear(_W8ALinear):
    """4-bit weights (int4wo's asymmetric groups of 32) times x quantized to int8 per block of 32."""

    WEIGHTS = ("weight_q4",)
    KIND = 2

    def __init__(self, rows: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(rows.shape[1] * 8 // 5, rows.shape[0], bias)
        self.register_buffer("weight_q4", rows)  # cpu_qdot.pack_int4: 16 channels a group, block by block

    @classmethod
    def from_linear(cls, linear: nn.Linear, **_) -> Int4W8ALinear:
        w = linear.weight.detach()
        q, sz = int4_quantize(w, INT4_GROUP_SIZE)
        layout = cpu_qdot.pack_int4(q, sz[..., 0].T, sz[..., 1].T)
        if layout is None:
            raise LoadError(f"a {w.shape[1]} -> {w.shape[0]} layer's 4-bit scales overflow fp16; pick int8w8a")
        return cls(layout, None if linear.bias is None else linear.bias.detach().clone())

    def _gemv(self, x):
        return cpu_qdot.int4_w8a(x, self.weight_q4, self.isa, self.prefetch)

    def dequantized(self) -> torch.Tensor:
        return cpu_qdot.dequantized(self.weight_q4)
