"""Our kernels (engine/kernels/cpu_gemm.py) against torch's, on the loaded model's own layer shapes with
random weights: every projection of one forward, at each row count, taking turns. Weight-only int8
and 4-bit against torch's weight-only kernels; the same weights through our integer dot-product
kernels with int8 activations (engine/kernels/cpu_qdot.py: `w8a`, in each form this CPU runs, e.g.
`int4 w8a avx512-vnni` and `int4 w8a avx2`); fp32 (our panel kernel) against oneDNN's packed copy
and the plain call (MKL). Each line also gives the GB/s of weight bytes (scales included) that the
one-row products stream, the figure to set beside `bench bandwidth`'s fp32 step."""

from __future__ import annotations

import functools

import torch
from torch import nn

from engine.cli import comma_list
from engine.bench import load_model, median
from engine.core import clock


def add_args(p):
    p.add_argument("--rows", default="1,4,8,32,256,1400", type=comma_list(int, 1),
                   help="rows per product (1: a decode step)")
    p.add_argument("--rounds", type=int, default=5)


def run(args, out):
    from engine.core.errors import LatencyLabError
    from engine.kernels import catalogue, cpu_gemm, cpu_qdot
    from engine.kernels.catalogue import Kernel
    from engine.model.loaded import weight_bytes
    from engine.platform import capabilities
    from engine.quant.w8a import Int4W8ALinear, Int8W8ALinear
    from engine.quant.weight_only import Int4WeightOnlyLinear, Int8WeightOnlyLinear
    from engine.runtime.activations import weight_only_activations

    reason = cpu_gemm.unavailable_reason()
    if reason:
        raise LatencyLabError(f"our kernels do not run here: {reason}")
    lm = load_model(args)
    shapes = [(m.in_features, m.out_features) for m in lm.model.modules() if isinstance(m, nn.Linear)]
    gen = torch.Generator().manual_seed(0)
    layers, nbytes = {}, {}
    for name, cls in (("int8", Int8WeightOnlyLinear), ("int4", Int4WeightOnlyLinear)):
        linears = [nn.Linear(k, n, bias=False) for k, n in shapes]
        for lin in linears:
            lin.weight.data = torch.randn(lin.out_features, lin.in_features, generator=gen) * 0.02
        dtype = weight_only_activations(f"{name}wo", "cpu", torch.float32, cache_dir=lm.cache_dir)  # torch's, as served
        both = [cls.from_linear(lin, compute_dtype=dtype) for lin in linears]  # ours and torch's layouts
        layers[f"{name} ours"] = [functools.partial(catalogue.run, Kernel.WO_OURS, layer) for layer in both]
        layers[f"{name} torch"] = [functools.partial(catalogue.run, Kernel.WO_TORCH, layer) for layer in both]
        w8a = {"int8": Int8W8ALinear, "int4": Int4W8ALinear}[name]
        built = []
        for isa in [i for i in cpu_qdot.ISAS if i in cpu_qdot.cpu_isas()]:
            built = [w8a.from_linear(lin) for lin in linears]
            for layer in built:
                layer.isa = isa  # each form this CPU runs, not only the chosen one
            layers[f"{name} w8a {isa}"] = [functools.partial(catalogue.run, Kernel.WO_INT8ACT, layer) for layer in built]
        if built:  # what a long prompt ran before the integer kernels took every row count (engine/runtime/plan.py)
            layers[f"{name} w8a dequant-fp32"] = [functools.partial(catalogue.run, Kernel.WO_DEQUANT_FP32, layer)
                                                  for layer in built]
        nbytes[name] = weight_bytes(nn.ModuleList(both))
    fp32 = [nn.Linear(k, n, bias=False) for k, n in shapes]
    for lin in fp32:
        lin.weight.data = torch.randn(lin.out_features, lin.in_features, generator=gen) * 0.02
        cpu_gemm.panels(lin)
    layers["fp32 ours"] = [functools.partial(catalogue.run, Kernel.OURS_FP32, lin) for lin in fp32]
    if all(catalogue.packed_weight(lin) is not None for lin in fp32):
        layers["fp32 packed"] = [functools.partial(catalogue.run, Kernel.ONEDNN_PACKED, lin) for lin in fp32]
    layers["fp32 plain"] = [functools.partial(catalogue.run, Kernel.ATEN, lin) for lin in fp32]
    nbytes["fp32"] = sum(lin.weight.numel() * 4 for lin in fp32)
    out(f"{capabilities.detect().summary()}; {torch.get_num_threads()} threads; {len(shapes)} projections "
        f"of {lm.name}")
    table, gbs = {}, {}
    with torch.inference_mode():
        for rows in args.rows:
            xs = {k: torch.randn(1, rows, k, generator=gen) for k in {k for k, _ in shapes}}
            x = next(iter(xs.values()))  # the inputs' device (our kernels': the CPU) for the clock
            times = {name: [] for name in layers}
            for _ in range(args.rounds + 1):  # the first round warms up
                for name, ls in layers.items():
                    t0 = clock.done_s(x)
                    for layer, (k, _) in zip(ls, shapes):
                        layer(xs[k])
                    times[name].append(clock.done_s(x) - t0)
            table[rows] = {name: round(median(ts[1:]) * 1e3, 2) for name, ts in times.items()}
            out(f"{rows:4d} rows: " + "; ".join(
                f"{bits} ours {table[rows][f'{bits} ours']:.1f} ms vs torch {table[rows][f'{bits} torch']:.1f} ms "
                f"({table[rows][f'{bits} torch'] / table[rows][f'{bits} ours']:.2f}x)" for bits in ("int8", "int4"))
                + "; fp32 ours " + ", ".join(f"{table[rows][n]:.1f} ms" + ("" if n == "fp32 ours" else f" {n[5:]}")
                                              for n in layers if n.startswith("fp32")))
            out("           w8a: " + "; ".join(f"{n} {table[rows][n]:.1f} ms" for n in layers if " w8a " in n))
            if rows == 1:  # one-row products stream their weights: GB/s of weight bytes (scales included)
                gbs[rows] = {n: round(nbytes[n.split()[0]] / (table[rows][n] * 1e-3) / 1e9, 1) for n in layers}
                out("           GB/s of weights at one row: " + "; ".join(f"{n} {v}" for n, v in gbs[rows].items()))
    one = table.get(1) or next(iter(table.values()))
    return {"ms": table, "gb_per_s_one_row": gbs.get(1), "weight_mb": {k: round(v / 1e6, 1) for k, v in nbytes.items()},
            "ratio": round(one["int4 torch"] / one["int4 ours"], 2),
            "capabilities": capabilities.detect().summary(), "threads": torch.get_num_threads()}
