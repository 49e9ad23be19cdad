"""The activation dtype of torch's weight-only kernels: the plan's decision that comes before a variant
is built (its layers store their scales in it, engine/quant/weight_only.py).

On CPU torch's int8/int4 weight-only kernels can be far faster with bf16 activations than with the
model's fp32 ones (on an AVX2-only CPU several times: docs/quantization.md), but bf16 costs precision:
one probe matmul per candidate dtype, alternating through the one race (engine/platform/decisions.py),
one thread, the least disturbed run of each; bf16 only where PROBE_MARGIN faster. Kept per machine
(`cached`): a restart builds the same layers, so gives the same bits. Every candidate is first checked
against the dequantized weights: a kernel that fails or is wrong is refused with its reason.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from engine.core.errors import LoadError, first_line
from engine.model.loaded import DTYPE_NAMES
from engine.platform import capabilities, decisions
from engine.quant.weight_only import Int4WeightOnlyLinear, Int8WeightOnlyLinear

PROBE_MARGIN = 1.2  # bf16 activations only if torch's kernel is at least this much faster in them (they cost precision)
_PROBE = (576, 1536)  # in, out features of the CPU's activation-dtype race: a SmolLM2-sized projection
_PROBE_ROUNDS = 7
probe_results: dict = {}  # (kernel, device type, dtype name) -> µs of one probe matmul, or the error (bench quant)
DTYPE_NAMES_BY = {v: k for k, v in DTYPE_NAMES.items()}


def weight_only_activations(method: str, device, model_dtype: torch.dtype,
                            shapes: tuple[tuple[int, int], ...] | None = None, cache_dir=None) -> torch.dtype:
    """The activation dtype torch's `method` kernel ('int8wo' or 'int4wo') runs in, for a model in
    `model_dtype` whose weight-only layers have `shapes` ((in, out) each; quantize.weight_only_shapes).

    CPU: bf16 or the model's dtype, whichever the kernel is faster in on this machine — raced once per
    machine and cached in `cache_dir`, unless capabilities `weight_only_activations` forces 'bf16' or
    'model'. CUDA: the model's dtype for int8; bf16 for int4 (the only one its kernel takes), checked on
    each of `shapes`: the packer's tile layout depends on the shape, so a probe of another shape says
    nothing (576 inputs, SmolLM2's, fail it). Raises LoadError if the kernel gives wrong results or fails
    in every candidate dtype."""
    device = torch.device(device)
    if device.type == "cuda":
        candidates = (torch.bfloat16,) if method == "int4wo" else (model_dtype,)
        probe_shapes = tuple(sorted(set(shapes))) if shapes else (_PROBE,)
    else:
        choice = capabilities.detect().weight_only_activations
        candidates = {"model": (model_dtype,), "bf16": (torch.bfloat16,)}.get(
            choice, tuple(dict.fromkeys((torch.bfloat16, model_dtype))))
        probe_shapes = (_PROBE,)
    return _activations(method, device.type, candidates, probe_shapes, cache_dir)


@functools.lru_cache(maxsize=None)
def _layers_for(method: str, device_type: str, candidates, shapes) -> tuple[dict, dict, torch.Tensor | None]:
    """Probe layers of `method` in each candidate dtype, checked against the dequantized weights: (layers
    that agree, by dtype; errors, by dtype name; the probe input)."""
    cls = {"int8wo": Int8WeightOnlyLinear, "int4wo": Int4WeightOnlyLinear}[method]
    gen = torch.Generator().manual_seed(0)
    layers, errors, x = {}, {}, None
    for dt in candidates:
        try:
            for k, n in reversed(shapes):  # the first last: it is the one timed
                linear = nn.Linear(k, n, bias=False)
                linear.weight.data = (torch.randn(n, k, generator=gen) * 0.02).to(device_type)
                x = torch.randn(1, k, generator=gen).to(device_type)
                layer = cls.from_linear(linear, compute_dtype=dt, keep_unpacked=True, ours_layout=False)
                want = x @ layer.dequantized().T
                got = layer.torch_product(x).float()
                err = float((got - want).abs().max() / want.abs().max())
                if not err < 0.05:  # bf16 activations: ~1e-2 relative; a broken kernel: far more (or NaN)
                    raise RuntimeError(f"wrong results on {k} -> {n} (relative error {err:.2g})")
            layers[dt] = layer
        except Exception as exc:  # noqa: BLE001 - a kernel that fails here is refused with its reason
            errors[DTYPE_NAMES_BY[dt]] = f"{type(exc).__name__}: {first_line(exc)}"
    return layers, errors, x


def _activations(method, device_type, candidates, shapes, cache_dir) -> torch.dtype:
    layers, errors, x = _layers_for(method, device_type, candidates, shapes)
    for name, error in errors.items():
        probe_results[(method, device_type, name)] = error
    if not layers:
        raise LoadError(f"torch's {method} kernel cannot run on this {device_type} ("
                        + "; ".join(f"{d}: {e}" for d, e in errors.items())
                        + "); pick int8 or nf4 (bitsandbytes) or an unquantized dtype")
    if len(layers) == 1:
        return next(iter(layers))
    names = [DTYPE_NAMES_BY[dt] for dt in layers]
    key = {**decisions.machine_key(), "kernel": method, "device": device_type, "candidates": names,
           "shapes": [list(s) for s in shapes]}
    decision, _ = decisions.cached(cache_dir, "weight-only-activations", key, lambda: _race_activations(layers, x),
                                   valid=lambda d: d.get("dtype") in names)
    for name, us in decision.get("us", {}).items():
        probe_results[(method, device_type, name)] = us
    return DTYPE_NAMES[decision["dtype"]]


@torch.inference_mode()
def _race_activations(layers: dict, x: torch.Tensor) -> dict:
    """One probe matmul per candidate dtype, alternating, one thread (on a shared, busy CPU a second
    thread mostly measures its waits), each after an untimed warm call; the least disturbed run counts.
    The first candidate (bf16) only where it clearly wins: a tie keeps precision."""
    names = {DTYPE_NAMES_BY[dt]: layer for dt, layer in layers.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = decisions.race({n: functools.partial(layer.torch_product, x) for n, layer in names.items()},
                           _PROBE_ROUNDS, x.device, warmup=0, prepare=lambda n: names[n].torch_product(x))
    finally:
        torch.set_num_threads(threads)
    best = {n: r.best(n) for n in names}
    first, *others = names
    rest = min(others, key=best.get) if others else None
    dtype = first if rest is None or best[first] * PROBE_MARGIN < best[rest] else rest
    return {"dtype": dtype, "us": {n: round(t * 1e6, 1) for n, t in best.items()}}
