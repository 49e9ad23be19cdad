"""The decoder layers of a forward in one C++ call (engine/kernels/cpu_layers.cpp), where every projection
runs on our fp32 kernel.

Why: the Python layer loop makes ~20 op calls a layer. Each call lets go of the interpreter lock
and takes it back, and in the server the HTTP thread holds it in between; while the model thread
waits, the OpenMP team falls asleep and the next product wakes it, so a batched forward took
longer in the server than alone (`python -m server.bench load` under load, `python -m engine.bench
bandwidth --python-loop` alone; figures: docs/batching.md). The C++ loop calls the same ATen ops
and our kernels on the same tensors in the same order, so it gives the same bits (tested against
the Python loop), and lets go of the lock once a forward.

Where: where our kernels build (engine/kernels/cpu_gemm.py) and every projection of the model takes fp32 rows
on our panel kernel (a plain fp32 Linear, or a bf16wo layer's bf16 weights: cpu_gemm.fp32_rows), or is a w8a
layer of one kind (engine/quant/w8a.py: int8w8a or int4w8a) told one
form of our integer kernels (engine/kernels/cpu_qdot.py), and the execution plan (engine/runtime/plan.py)
sends every row to those kernels; else the Python loop runs. Its switch (engine/kernels/switches.py, `LATENCY_LAB_LAYERS=off`)
forces the Python loop; `switches.forced_off("layers")` does for a block of code.
"""

from __future__ import annotations

import torch

from engine.core.config import KV_CACHE_DTYPES
from engine.kernels import cpu_gemm, cpu_qdot, switches
from engine.kernels.cpu_gemm import fp32_rows, panels

NAME = "one C++ call a forward (engine/kernels/cpu_layers.py)"
KV_KINDS = KV_CACHE_DTYPES  # the cache precisions it stores and reads (KVCache.kind): every one (Plan.loop_kv)
PYTHON = "Python, an op call at a time"


def unavailable_reason() -> str | None:
    """Why forwards run their layers in Python here (None: in one C++ call where the model allows):
    its switch (engine/kernels/switches.py, `layers`), or our product kernel's (the loop calls it)."""
    return switches.off_reason("layers") or cpu_gemm.unavailable_reason()


def shape_reason(model) -> str | None:
    """Why `model`'s shape keeps its layers out of the C++ loop (None: it does not): the loop ropes q and k
    in 8-float vectors over each half of a head (cpu_fused.cpp rope_qk), so head_dim a multiple of 16."""
    d = model.head_dim
    return None if d % 16 == 0 else f"the C++ loop ropes heads whose size is a multiple of 16; this model's is {d}"


def _projections(blk) -> tuple:
    return blk.qkv, blk.o, blk.gate_up, blk.down


def _kind(lin, form: str | None) -> tuple[int, int] | None:
    """(kind, form code) of a projection the loop runs (cpu_layers.cpp: 0 panels for fp32 rows: fp32 weights, or
    bf16 ones (cpu_gemm.fp32_rows); 1 int8w8a, 2 int4w8a),
    None where it cannot. The w8a layers are known by their attributes (engine/quant/w8a.py: int8_activations,
    KIND and WEIGHTS, declared there once; quant is above);
    `form` is the plan's for them (Plan.w8a_form; None: the torch reference, which the loop does not run)."""
    if fp32_rows(lin):
        return 0, 0
    if not getattr(lin, "int8_activations", False) or form is None:
        return None
    return lin.KIND, cpu_qdot.ISAS[form][0]


def loop_kind(model, form: str | None) -> tuple[int, int] | None:
    """The one (kind, form code) every projection of `model` (a FastLlama) has for the loop (`_kind`, w8a
    layers in the plan's `form`), None where they differ or one cannot run in it: what the plan asks
    before it gives a model the C++ loop."""
    kinds = {_kind(lin, form) for blk in model.blocks for lin in _projections(blk)}
    return next(iter(kinds)) if len(kinds) == 1 and None not in kinds else None


def layer_weights(model, form: str | None, head_norm: bool = False, hardware_stream: tuple[int, ...] = ()) -> tuple | None:
    """What run_layers reads, per layer (the norms' weights, the projections' panels and biases; then the
    kind, the form and the model's sizes; then the step's ends: the embedding table where the model's is a plain
    nn.Embedding, and with `head_norm` (the plan's) the final norm and the w8a head's product arguments) as one
    C++ object (cpu_layers.cpp `Layers`), with whether it holds the embedding and the head: (layers, embedded,
    head). None where the loop cannot run this model (a projection that is not a plain fp32 CPU Linear nor a
    w8a layer of the first one's class, or the kernels are off; the plan checks the rest, e.g. fp32
    activations). `form`, `hardware_stream`: the plan's for the w8a layers (Plan.w8a_form,
    Plan.w8a_hardware_stream). Makes the panels: call it only where our kernel runs the rows (the runner keeps
    the object: walking the model each forward cost a measurable share of a one-row step, docs/history.md).
    The walk reads the modules' own dicts: nn.Module's attribute lookup made it ~0.9 ms of a ~9 ms
    int4w8a step (1 thread, Zen 4), ~0.1 ms this way."""
    if model.device.type != "cpu" or unavailable_reason() is not None:  # never built for a GPU model
        return None
    first = model.blocks[0].qkv
    kind_isa = _kind(first, form)
    if kind_isa is None:
        return None
    kind = kind_isa[0]
    cls = type(first)
    weights, biases = [], []
    for blk in model.blocks._modules.values():
        mods = blk._modules
        lins = (mods["qkv"], mods["o"], mods["gate_up"], mods["down"])
        if kind == 0:
            if not all(fp32_rows(lin) for lin in lins):
                return None
            tensors, bias = [[panels(lin)] for lin in lins], [lin._parameters["bias"] for lin in lins]
        else:  # every one a w8a layer of the first one's class
            if not all(type(lin) is cls for lin in lins):
                return None
            tensors = [[lin._buffers[name] for name in lin.WEIGHTS] for lin in lins]
            bias = [lin._buffers["bias"] for lin in lins]
        weights += [mods["attn_norm"]._parameters["weight"], *tensors[0], *tensors[1],
                    mods["mlp_norm"]._parameters["weight"], *tensors[2], *tensors[3]]
        biases += bias
    blk = model.blocks[0]
    embed = model.embed._parameters["weight"] if type(model.embed) is torch.nn.Embedding else None
    head = (None, 0.0, [], 0, 0, None)
    if head_norm:  # the plan folds the final norm into a w8a head's quantizer (Plan.head_norm)
        head_w, head_kind, head_bias, head_form, _ = model.lm_head.product_args()
        head = (model.norm.weight, model.norm.eps, head_w, head_kind, cpu_qdot.code(head_form, head_kind not in hardware_stream),
                head_bias)
    isa = cpu_qdot.code(form, kind not in hardware_stream) if kind else 0
    norm, norm_eps, head_w, head_kind, head_isa, head_bias = head
    # one object the C++ call takes whole: its lists converted once here, not each forward (cpu_layers.cpp Layers)
    layers = cpu_gemm.extension().Layers(
        weights, biases, [blk.qkv.out_features, blk.o.out_features, blk.gate_up.out_features, blk.down.out_features],
        blk.attn_norm.eps, model.n_heads, model.n_kv_heads, model.head_dim, blk.q_size, blk.kv_size, blk.scaling,
        cpu_gemm.wide(), kind, isa, embed, head_w, norm, norm_eps, head_kind, head_isa, head_bias)
    return layers, embed is not None, head_norm


def run_layers(model, layers: tuple, ids, cos, sin, caches, starts, lengths, offsets, decode, others,
               masks, logits: bool = False):
    """engine/runtime/eager.py's layer loop (`blocks`) over the rows of token ids `ids` [R] in one call, the
    embedding in it where `layers` has the table. `layers`: layer_weights(model, plan.w8a_form, plan.head_norm);
    the rest are eager.forward's (`decode` the sequences whose row takes our attention kernel, `others` the ones
    through SDPA with masks[b]); a cache at another precision than the model's (KVCache.kind) brings its int8
    scales, and its rows are read and stored as the Python loop does (engine/runtime/eager.py). Returns x after
    the last layer [1, R, hidden]; with `logits` (and the head in `layers`) each sequence's last row's logits
    [B, vocab], the final norm folded into the head's product as w8a.py normed_product does."""
    handle, embedded, head = layers
    x = ids if embedded else model.embed(ids[None])
    return cpu_gemm.extension().batch_layers(
        handle, x, cos, sin, [c.k for c in caches], [c.v for c in caches], [getattr(c, "k_scale", None) for c in caches],
        [getattr(c, "v_scale", None) for c in caches], starts, lengths, offsets, decode, others, masks, embedded, logits and head)
