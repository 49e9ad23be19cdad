"""The compiled step mode on CPU: a one-token decode step compiled by torch.compile (Inductor).

Why: a decode step of the bundled model is ~900 small ATen calls around 121 matmuls, each
dispatched from Python. With 4-bit weights the matmuls take about half of the step, so the rest —
norms, rotary positions, residual adds, casts, and the calls themselves — bounds the speed.
Inductor fuses that glue into a few C++ kernels and calls the graph as one unit. It pays for the
quantized variants and, through our fp32 kernel, for fp32 too; `python -m engine.bench bandwidth
--compiled` prints eager and compiled side by side on the machine at hand (figures, with CPU and
date: docs/compiled-step.md).

Design:
- The graph is the one layer loop (engine/runtime/blocks.py `blocks`, which the eager forward runs
  for any batch), so eager and compiled cannot drift. Not the whole batched forward: its per-sequence
  bookkeeping (row lists, masks, host-side lengths) would be constants of the graph and recompile it
  every step; the step keeps only the embedding, positions and head around `blocks`. Its inputs are
  the token and its position, both one-element tensors: its shapes never change, so it never recompiles.
- Writing the new key/value into the cache and attending over its valid prefix stay outside the
  graph as one opaque op per layer (`latency_lab::decode_attend`), which finds the cache through
  `_CACHES`: the prefix grows every step and the cache may be reallocated, and neither is a shape
  the graph sees. The write is in place (a write into the cache inside the graph made Inductor copy
  the whole cache per layer: docs/compiled-step.md).
- Projections run the kernel the plan (engine/runtime/plan.py) names for one row, except the two a
  graph cannot hold (`for_graph`): the packed oneDNN copy (F.linear instead) and the oneDNN switch.
- Fused kernels round in their own order: the compiled step agrees with the eager one closely,
  not bit for bit, so its top-1 agreement with the eager step is measured when it is built
  (`check`, through the one race), shown in engine info, and tested; greedy output may differ after many tokens.
- Compiled once per runner (one per served model object), on the first request that asks (its setup
  stage shows the cost, seconds with Inductor's on-disk cache warm, much longer cold:
  docs/compiled-step.md), then kept.

Where it cannot serve (the plan's step_modes say why; a request asking gets an InvalidRequest): the
generic transformers forward, bitsandbytes layers, plain bf16 linears on CPU (their one-row matmuls
need oneDNN switched off, which a graph cannot do; a bf16 `int8wo+head` or `int4wo+head` has none),
and machines without a C++ compiler. On a GPU the toggle replays the static step from CUDA graphs
(engine/runtime/cuda_graph.py).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import types

import torch
import torch.nn.functional as F

from engine.core import clock
from engine.core.errors import InvalidRequest, first_line
from engine.kernels import catalogue, cpu_attention
from engine.kernels.catalogue import Kernel
from engine.platform import capabilities, decisions
from engine.quant.quality import quality_inputs
from engine.runtime.blocks import blocks

_LIB = torch.library.Library("latency_lab", "DEF")
_LIB.define("decode_attend(Tensor q, Tensor k, Tensor v, Tensor step, int layer, Tensor pos, float scale) -> Tensor")
_CACHES: dict[int, tuple] = {}  # CompiledStep.slot -> (the KVCache its graph is stepping now, whether our attention kernel serves)
_SLOTS = itertools.count()
# Dynamo checks a graph's guards before every call (its share of a step: docs/compiled-step.md). Each model's
# step has its own code object holding exactly one graph, and `_run` makes every input itself
# (same dtypes, shapes and devices every step), so there is nothing for a guard to tell apart and
# the check is skipped once the graph is built. (set_stance takes effect when called, so this is a
# function: each `with` sets the stance and restores the previous one.)


def _unguarded():
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def _decode_attend(q, k, v, step_t, layer: int, pos_t, scale: float):
    """Store one token's k, v at position `pos_t` of layer `layer` of the cache that compiled step
    `step` is running on; attend q over positions [0, pos] (returns [1, heads, head_dim]). The cache is not an input of the graph:
    its capacity, and whether it was allocated in inference mode, would each be a guard, and a
    failed guard recompiles. `pos_t` and `step_t` are one-element tensors, not ints: an int would
    be a constant of the graph (a position: a recompile per step; a step number: a graph that
    differs per model, which Inductor's disk cache could not serve to the next model)."""
    (cache, ours), pos = _CACHES[int(step_t[0])], int(pos_t[0])
    if ours:  # the eager step's own decode attention, as the plan says (it stores k, v too)
        return cpu_attention.decode_attention_heads(q, k, v, [cache], [0], [pos], layer, scale)
    keys, values = cache.k[layer], cache.v[layer]
    keys[:, :, pos] = k[:, :, 0]
    values[:, :, pos] = v[:, :, 0]
    return F.scaled_dot_product_attention(q, keys[:, :, : pos + 1], values[:, :, : pos + 1], scale=scale,
                                          enable_gqa=q.shape[1] != keys.shape[1])[0].transpose(0, 1)


for _key in ("CPU", "CUDA"):
    _LIB.impl("decode_attend", _decode_attend, _key)
_LIB.impl("decode_attend", lambda q, k, v, step_t, layer, pos, scale: q.new_empty(q.shape[2], q.shape[1], q.shape[3]),
          "Meta")  # [1 row, heads, head_dim], as blocks' `attend` returns


def cache_per_cpu() -> str | None:
    """Point Inductor's caches at a folder of this CPU's own; returns it (None: the user chose one).

    Inductor keys a compiled graph on the graph and torch's version, not on the instruction set it
    generated code for (seen with torch 2.13: a graph compiled with ATEN_CPU_CAPABILITY=default was a
    cache hit in the next, AVX2 process). A cache that moves between machines, as a CI runner's or a
    home folder's may, could then hand AVX-512 code to an AVX2 CPU."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # Inductor writes its default here once it has run
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return None

    caps = capabilities.detect()
    isa = hashlib.sha1(",".join(caps.isa).encode()).hexdigest()[:8]
    folder = os.path.join(default_cache_dir(), f"cpu-{caps.torch_cpu_capability.lower()}-{isa}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def refusal(reason: str) -> InvalidRequest:
    """The error a request with the toggle gets where the plan says the compiled step cannot serve."""
    return InvalidRequest(f"compiled decode: {reason}. Turn Compiled step off.", "compiled_decode")


def for_graph(kernel: Kernel) -> Kernel:
    """The kernel a compiled graph runs where the eager forward would run `kernel`: the packed oneDNN
    copy becomes F.linear (Inductor's lowering of that op asserts on weights it did not pack itself,
    seen with torch 2.13), and oneDNN is never switched inside a graph (the plan refuses bf16 plain
    linears on CPU for that)."""
    return Kernel.ATEN if kernel in (Kernel.ONEDNN_PACKED, Kernel.ATEN_NO_ONEDNN) else kernel


class CompiledStep:
    """A runner's compiled one-token step. `prepare()` compiles it (once); `step(ids, cache)` runs one
    token through the graph, as the eager forward would without all_logits."""

    def __init__(self, model, plan):
        self.model, self.plan = model, plan
        self.slot = next(_SLOTS)  # which cache the attention op writes (_CACHES); an input of the graph
        self.info: dict | None = None  # what prepare() measured
        self.graph = None
        self._failed: str | None = None  # why compiling failed (then it is not tried again)
        self._lock = threading.Lock()
        # the plan's one-row kernels as a graph runs them: decided here, outside the graph
        self._kernels = {role: for_graph(lp.kernel(1)) for role, lp in plan.linears.items()}
        self._ours_attention = plan.attention == cpu_attention.PLAN_NAME

    def _linear(self, role, module, x):
        """A projection inside the graph: our kernels are opaque ops with fakes, the rest F.linear."""
        kernel = self._kernels[role]
        if kernel is Kernel.ATEN and type(module) is torch.nn.Linear:
            return F.linear(x, module.weight, module.bias)
        return catalogue.run(kernel, module, x)

    def _step(self, ids, pos_t, pos_host, slot_t):
        m = self.model
        cos, sin = m.cos.index_select(0, pos_t), m.sin.index_select(0, pos_t)

        def attend(i, blk, q, k, v):  # the position on the host: reading it does not wait for a GPU
            return torch.ops.latency_lab.decode_attend(q, k, v, slot_t, i, pos_host, blk.scaling)

        x = blocks(m, m.embed(ids[None]), cos, sin, self._linear, attend)
        return self._linear("lm_head", m.lm_head, m.norm(x))[0].float()

    def _run(self, graph, ids, cache) -> torch.Tensor:
        """One step of `graph` on `cache` (in inference mode: the graph's inputs are made here, so
        they are always inference tensors and never fail a guard)."""
        start = cache.length
        if start + 1 > self.model.max_context:
            raise ValueError(f"position {start + 1} is beyond the context window ({self.model.max_context})")
        cache.ensure_capacity(start + 1)
        _CACHES[self.slot] = (cache, self._ours_attention)
        ids = ids if isinstance(ids, torch.Tensor) else torch.tensor(ids)
        inputs = (ids.reshape(1).to(torch.long, copy=True), torch.tensor([start], device=ids.device),
                  torch.tensor([start]), torch.tensor([self.slot]))
        try:
            if graph is self.graph:  # compiled and checked: its guards can be skipped (see _unguarded)
                with _unguarded():
                    logits = graph(*inputs)
            else:
                logits = graph(*inputs)
        finally:
            del _CACHES[self.slot]
        cache.length = start + 1
        return logits

    @torch.inference_mode()
    def step(self, ids, cache) -> torch.Tensor:
        return self._run(self.graph, ids, cache)

    def prepare(self, eager_step, tokenizer) -> float:
        """Compile (first call only) and check the graph against `eager_step(tok, cache)`; returns the
        seconds it took (0.0 when already compiled). Raises InvalidRequest when it cannot be built here."""
        with self._lock:
            if self.graph is not None:
                return 0.0
            if self._failed:  # it failed once: not again for every request
                raise InvalidRequest(self._failed, "compiled_decode")
            t0 = clock.now_ns()
            cache_per_cpu()
            # Dynamo keeps compiled graphs per code object, at most `recompile_limit` (8) each: a copy
            # of _step's code per runner keeps one model's graph from counting against another's
            own_step = types.FunctionType(CompiledStep._step.__code__.replace(), globals(), "_step")
            graph = torch.compile(types.MethodType(own_step, self), dynamic=False)
            try:
                self.info = check(self.model, eager_step, lambda tok, cache: self._run(graph, tok, cache), tokenizer)
            except Exception as exc:  # a compiler or lowering failure: the eager step keeps serving
                self._failed = (f"compiled decode could not be built here ({type(exc).__name__}: "
                                f"{first_line(exc)[:300]}). Turn Compiled step off.")
                raise InvalidRequest(self._failed, "compiled_decode") from exc
            self.info["compile_s"] = round((clock.done_ns(self.model.device) - t0) / 1e9, 1)
            self.graph = graph
            return self.info["compile_s"]


def check(model, eager_step, step, tokenizer, steps: int = 32) -> dict:
    """Teacher-force one quality text (engine/quant/quality.py) through the eager step and `step` from
    the same prefix, alternating (the one race, engine/platform/decisions.py): how often they rank the
    same token first, the largest logit difference, and both steps' times (medians; the first round,
    the compile itself, dropped). Fused kernels round in their own order, so the two agree closely but
    not bit for bit (measured, never assumed)."""
    ids = quality_inputs(tokenizer, 1)[0][: 16 + steps]
    prefix, steps = 16, len(ids) - 16
    caches = {"eager": model.new_cache(len(ids) + 1), "compiled": model.new_cache(len(ids) + 1)}
    for cache in caches.values():
        eager_step(torch.tensor(ids[:prefix], device=model.device), cache)
    tokens = iter(ids[prefix:])
    got: dict = {}
    seen = {"diff": 0.0, "same": 0}

    def compare(name):  # untimed, before each run: the previous round's pair of logits, then this round's token
        if name == "eager":
            if got:
                seen["diff"] = max(seen["diff"], float((got["compiled"] - got["eager"]).abs().max()))
                seen["same"] += int(got["compiled"].argmax()) == int(got["eager"].argmax())
            got["tok"] = torch.tensor([next(tokens)])

    runs = {name: (lambda name=name, run=run: got.__setitem__(name, run(got["tok"], caches[name])))
            for name, run in (("eager", eager_step), ("compiled", step))}
    with torch.inference_mode():
        r = decisions.race(runs, steps - 1, model.device, warmup=1, prepare=compare)
        seen["diff"] = max(seen["diff"], float((got["compiled"] - got["eager"]).abs().max()))
        seen["same"] += int(got["compiled"].argmax()) == int(got["eager"].argmax())
    eager, compiled = r.median("eager") * 1e3, r.median("compiled") * 1e3
    return {"top1_agreement": round(seen["same"] / steps, 3), "positions": steps, "max_logit_diff": round(seen["diff"], 4),
            "eager_ms": round(eager, 2), "compiled_ms": round(compiled, 2), "ratio": round(compiled / eager, 3)}
