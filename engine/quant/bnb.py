"""bitsandbytes variants (LLM.int8, nf4, fp4): checked before import, built per Linear.

On an x86 CPU without AVX2 its native library dies with SIGILL at import, so `check` reads the
capabilities first and never imports it there (engine/platform/capabilities.py `bnb_unusable`).
"""

from __future__ import annotations

import logging
import sys

import torch
from torch import nn

from engine.core.errors import LoadError
from engine.platform import capabilities
from engine.model.loaded import LoadedModel, first_line
from engine.quant.weight_only import onednn_on

BNB_BLOCKSIZE = 64
BNB_INT8_THRESHOLD = 6.0  # LLM.int8's outlier threshold (also transformers' default)
# bitsandbytes' CPU 4-bit kernel (AVX512-BF16) packs output rows in blocks of 32 and keeps one
# absmax per 64-weight block of each row: it needs out_features % 32 == 0, in_features % 64 == 0.
BNB_CPU_4BIT_ROWS = 32


def check(name: str, base: LoadedModel, quantizable) -> None:
    """Raise LoadError if bitsandbytes' `name` cannot run here (`quantizable`: the model's linears)."""
    unusable = capabilities.detect().bnb_unusable
    if unusable:  # checked before any import: on such a CPU importing it kills the process
        raise LoadError(f"quantization {name!r}: {unusable} Try int8wo or int4wo (torch's own kernels).")
    try:
        module = _import_bitsandbytes()
    except Exception as exc:
        raise LoadError(f"quantization {name!r} needs bitsandbytes, which failed to load: "
                        f"{type(exc).__name__}: {first_line(exc)}") from exc
    missing = native_library_missing(module) if base.device.type != "cpu" else None
    if missing:  # known before building: no weights copied, nothing to fail half-way
        raise LoadError(f"quantization {name!r}: bitsandbytes has no working native library for "
                        f"{base.device.type} here ({missing}); `python -m bitsandbytes` says why. Try int8wo or int4wo.")
    if name in ("nf4", "fp4") and base.device.type == "cpu" and capabilities.detect().bnb_cpu_avx512bf16:
        for _, attr, lin in quantizable:
            if lin.out_features % BNB_CPU_4BIT_ROWS or lin.in_features % BNB_BLOCKSIZE:
                raise LoadError(
                    f"quantization {name!r} cannot run on this CPU with this model: bitsandbytes' 4-bit CPU "
                    f"kernel needs layers with output sizes divisible by {BNB_CPU_4BIT_ROWS} and input sizes "
                    f"divisible by {BNB_BLOCKSIZE}, and {attr} is {lin.in_features} -> {lin.out_features}. "
                    "Try int8 or int8wo."
                )


def native_library_missing(module) -> str | None:
    """Why the imported bitsandbytes has no native library (None: it has one). Without its CUDA binary
    (built for another CUDA, or its runtime libraries not found) the import still succeeds and puts a
    stand-in in `cextension.lib` that raises at the first kernel call."""
    lib = getattr(getattr(module, "cextension", None), "lib", None)
    if type(lib).__name__ != "ErrorHandlerMockBNBNativeLibrary":
        return None
    return first_line(str(getattr(lib, "error_msg", "") or "")) or "its binary did not load"


def _import_bitsandbytes():
    if "bitsandbytes" not in sys.modules:
        # Two warnings that are noise here: at import, that the optional `kernels` package (which
        # downloads a kernel from the model hub) is missing; and on every int8 forward, that
        # activations are cast to fp16 (which is what LLM.int8 does). Errors still show.
        logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
        logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    import bitsandbytes

    return bitsandbytes


_LINEAR_8BIT = None


def _linear_8bit_class():
    """bitsandbytes' Linear8bitLt, its matmul run with oneDNN on (see `onednn_on`)."""
    global _LINEAR_8BIT
    if _LINEAR_8BIT is None:
        bnb = _import_bitsandbytes()

        class Linear8bitLtOneDNN(bnb.nn.Linear8bitLt):
            def forward(self, x):
                with onednn_on():
                    return super().forward(x)

        _LINEAR_8BIT = Linear8bitLtOneDNN
    return _LINEAR_8BIT


def int8_linear(linear: nn.Linear, name: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
    bnb = _import_bitsandbytes()
    q = _linear_8bit_class()(linear.in_features, linear.out_features, bias=linear.bias is not None,
                            has_fp16_weights=False, threshold=BNB_INT8_THRESHOLD, device="meta")
    # Int8Params quantizes when moved off the CPU copy: a copy, so the base's weight is untouched.
    q.weight = bnb.nn.Int8Params(linear.weight.detach().to("cpu", copy=True), requires_grad=False,
                                 has_fp16_weights=False)
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return q.to(device)


def four_bit_linear(linear: nn.Linear, name: str, device: torch.device, dtype: torch.dtype) -> nn.Module:
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
