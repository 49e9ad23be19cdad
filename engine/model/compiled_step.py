"""The `compiled_decode` toggle: a one-token decode step compiled by torch.compile (Inductor).

Why: a decode step of the bundled model is ~900 small ATen calls around 121 matmuls, each
dispatched from Python. With 4-bit weights the matmuls take about half of the step, so the rest —
norms, rotary positions, residual adds, casts, and the calls themselves — bounds the speed.
Inductor fuses that glue into a few C++ kernels and calls the graph as one unit. It pays for the
quantized variants and, through our fp32 kernel, for fp32 too; `python -m engine.bench bandwidth
--compiled` prints eager and compiled side by side on the machine at hand (figures, with CPU and
date: docs/compiled-step.md).

Design:
- The graph is the one forward's block loop (engine/model/forward.py `blocks`, which the eager
  forward runs for any batch), so eager and compiled cannot drift. Not the whole batched `forward`:
  its per-sequence bookkeeping (row lists, masks, host-side lengths) would be constants of the graph
  and recompile it every step; the step keeps only the embedding, positions and head around `blocks`. Its inputs are the token and its position, both one-element tensors: its shapes never
  change, so it never recompiles.
- Writing the new key/value into the cache and attending over its valid prefix stay outside the
  graph as one opaque op per layer (`latency_lab::decode_attend`), which finds the cache through
  `_CACHES`: the prefix grows every step and the cache may be reallocated, and neither is a shape
  the graph sees. The write is in place (a write into the cache inside the graph made Inductor copy
  the whole cache per layer: docs/compiled-step.md).
- Projections run the kernel engine/kernels/choose.py names for one row, except the two a graph
  cannot hold (`for_graph`): the packed oneDNN copy (F.linear instead) and the oneDNN switch.
- Fused kernels round in their own order: the compiled step agrees with the eager one closely,
  not bit for bit, so its top-1 agreement with the eager step is measured when it is built
  (`info`), shown in engine info, and tested; greedy output may differ after many tokens.
- Compiled once per model object, on the first request that asks (its setup stage shows the
  cost, seconds with Inductor's on-disk cache warm, much longer cold: docs/compiled-step.md), then kept.

Not compiled (a request asking gets an InvalidRequest saying why): the generic transformers
forward, bitsandbytes layers, plain bf16 linears on CPU (their one-row matmuls need oneDNN
switched off, which a graph cannot do; a bf16 `int8wo+head` or `int4wo+head` has none), and
machines without a C++ compiler (CPU) or Triton (CUDA).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import statistics
import threading
import types

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.errors import InvalidRequest
from engine.kernels import choose, cpu_attention
from engine.kernels.choose import Kernel
from engine.kernels.cpu_gemm import ours, plain_fp32_cpu
from engine.platform import capabilities
from engine.core import clock
from engine.model import cuda_graph, forward
from engine.model.blocks import blocks
from engine.model.fast_llama import FastLlama
from engine.model.loaded import first_line
from engine.quant.quality import quality_inputs
from engine.quant.weight_only import _WeightOnlyLinear

_LIB = torch.library.Library("latency_lab", "DEF")
_LIB.define("decode_attend(Tensor q, Tensor k, Tensor v, Tensor step, int layer, Tensor pos, float scale) -> Tensor")
_CACHES: dict[int, object] = {}  # CompiledDecode.slot -> the KVCache its graph is stepping now
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
    cache, pos = _CACHES[int(step_t[0])], int(pos_t[0])
    if cpu_attention.serves(cache.k, q.shape[1]):  # the eager step's own decode attention (it stores k, v too)
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


def unavailable_reason(model) -> str | None:
    """Why `model` cannot take a compiled decode step here (None: it can)."""
    return machine_reason(model) or weights_reason(model)


def machine_reason(model) -> str | None:
    """Why no variant of `model` can take a compiled step on this machine (the toggle is off for all)."""
    if not isinstance(model, FastLlama):
        return "the compiled step needs our Llama-family forward; this model runs the generic transformers one"
    if model.device.type == "cpu" and not capabilities.detect().cpp_compiler:
        return "torch.compile needs a C++ compiler on CPU (g++, or $CXX); none was found"
    return None  # on a GPU the step is captured as CUDA graphs (engine/model/cuda_graph.py): nothing to build


def weights_reason(model) -> str | None:
    """Why these weights cannot be compiled where another variant of the same model could (None: they can)."""
    if not isinstance(model, FastLlama):
        return None
    kinds = {type(m).__name__ for m in model.modules() if _is_projection(m)
             and not isinstance(m, _WeightOnlyLinear) and type(m) is not nn.Linear}
    if kinds:
        return f"the compiled step does not trace {', '.join(sorted(kinds))} layers (bitsandbytes); pick int8wo or int4wo"
    if model.device.type == "cpu" and model.dtype == torch.bfloat16 and any(type(m) is nn.Linear for m in model.modules()):
        return ("a bf16 model's plain linears take their one-row matmuls on CPU with oneDNN switched off, "
                "which a compiled graph cannot do; pick a variant whose every linear is weight-only "
                "(int8wo+head, int4wo+head) or fp32 weights")
    return None


def refusal(reason: str) -> InvalidRequest:
    """The error a request with the toggle gets where `unavailable_reason` says no."""
    return InvalidRequest(f"compiled decode: {reason}. Turn Compiled step off.", "compiled_decode")


def for_graph(kernel: Kernel) -> Kernel:
    """The kernel a compiled graph runs where the eager forward would run `kernel`: the packed oneDNN
    copy becomes F.linear (Inductor's lowering of that op asserts on weights it did not pack itself,
    seen with torch 2.13), and oneDNN is never switched inside a graph (weights_reason refuses bf16
    plain linears on CPU for that)."""
    return Kernel.ATEN if kernel in (Kernel.ONEDNN_PACKED, Kernel.ATEN_NO_ONEDNN) else kernel


def _is_projection(m) -> bool:
    return hasattr(m, "in_features") and hasattr(m, "out_features")


class CompiledDecode:
    """A model's compiled one-token step. `prepare()` compiles it (once); `forward(ids, cache)`
    is FastLlama.forward for one token without all_logits, through the graph."""

    def __init__(self, model: FastLlama):
        self.model = model
        self.slot = next(_SLOTS)  # which cache the attention op writes (_CACHES); an input of the graph
        self.info: dict | None = None  # what prepare() measured
        self._graph = None
        self._failed: str | None = None  # why compiling failed (then it is not tried again)
        self._lock = threading.Lock()
        # whether the one decision sends one fp32 row to our kernel (read while tracing: decided here, outside the graph)
        self._ours_fp32 = for_graph(choose.choose(model.lm_head, 1, choose.plan_of(model))) is Kernel.OURS_FP32

    def _linear(self, module, x):
        """A projection inside the graph: the kernel choose.choose names for one row, as `for_graph`
        maps it, decided before tracing (`_ours_fp32`; a weight-only layer's own `gemv` flag is its
        decision): our kernels are opaque ops with fakes, the rest F.linear."""
        if isinstance(module, _WeightOnlyLinear):
            return module.compute(x)
        if self._ours_fp32 and plain_fp32_cpu(module):
            return ours(module, x)
        return F.linear(x, module.weight, module.bias)

    def _step(self, ids, pos_t, pos_host, slot_t):
        m = self.model
        cos, sin = m.cos.index_select(0, pos_t), m.sin.index_select(0, pos_t)

        def attend(i, blk, q, k, v):  # the position on the host: reading it does not wait for a GPU
            return torch.ops.latency_lab.decode_attend(q, k, v, slot_t, i, pos_host, blk.scaling)

        x = blocks(m, m.embed(ids[None]), cos, sin, self._linear, attend)
        return self._linear(m.lm_head, m.norm(x))[0].float()

    def _run(self, graph, ids, cache) -> torch.Tensor:
        """One step of `graph` on `cache` (in inference mode: the graph's inputs are made here, so
        they are always inference tensors and never fail a guard)."""
        start = cache.length
        if start + 1 > self.model.max_context:
            raise ValueError(f"position {start + 1} is beyond the context window ({self.model.max_context})")
        cache.ensure_capacity(start + 1)
        _CACHES[self.slot] = cache
        inputs = (ids.reshape(1).to(torch.long, copy=True), torch.tensor([start], device=ids.device),
                  torch.tensor([start]), torch.tensor([self.slot]))
        try:
            if graph is self._graph:  # compiled and checked: its guards can be skipped (see _unguarded)
                with _unguarded():
                    logits = graph(*inputs)
            else:
                logits = graph(*inputs)
        finally:
            del _CACHES[self.slot]
        cache.length = start + 1
        return logits

    def __deepcopy__(self, memo):
        """None: a variant is built by deep-copying the loaded model, and its copy compiles its own
        step (a graph, and this lock, cannot be copied)."""
        return None

    def new_cache(self, capacity: int):
        return self.model.new_cache(capacity)

    @property
    def setup_stage(self) -> str:
        """The setup span `prepare` fills: Inductor compiles on CPU, CUDA graphs are captured on a GPU."""
        return "capture" if self.model.device.type == "cuda" else "compile"

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, all_logits: bool = False) -> torch.Tensor:
        """FastLlama.forward; one token without all_logits goes through the graph (once prepared)."""
        if ids.shape[0] != 1 or all_logits or self._graph is None:
            return self.model.forward(ids, cache, all_logits)
        if self._graph == "cuda":  # the static step, replayed from its CUDA graph
            return forward.forward(self.model, [ids], [cache], graph=True)
        return self._run(self._graph, ids, cache)

    def prepare(self, tokenizer, capacity: int | None = None) -> float:
        """Compile (first call only) and check the graph against the eager step; returns the seconds
        it took (0.0 when already compiled). On a GPU: capture the CUDA graphs of the bucket a cache
        of `capacity` positions steps in, checked once against the uncaptured step. Raises
        InvalidRequest when it cannot be built here."""
        if self.model.device.type == "cuda":
            return self._prepare_graphs(tokenizer, capacity)
        with self._lock:
            if self._graph is not None:
                return 0.0
            reason = unavailable_reason(self.model)
            if reason:
                raise refusal(reason)
            if self._failed:  # it failed once: not again for every request
                raise InvalidRequest(self._failed, "compiled_decode")
            t0 = clock.now_ns()
            cache_per_cpu()
            # Dynamo keeps compiled graphs per code object, at most `recompile_limit` (8) each: a copy
            # of _step's code per model keeps one model's graph from counting against another's
            own_step = types.FunctionType(CompiledDecode._step.__code__.replace(), globals(), "_step")
            graph = torch.compile(types.MethodType(own_step, self), dynamic=False)
            try:
                self.info = self._check(lambda tok, cache: self._run(graph, tok, cache), tokenizer)
            except Exception as exc:  # a compiler or lowering failure: the eager step keeps serving
                self._failed = (f"compiled decode could not be built here ({type(exc).__name__}: "
                                f"{first_line(exc)[:300]}). Turn Compiled step off.")
                raise InvalidRequest(self._failed, "compiled_decode") from exc
            self.info["compile_s"] = round((clock.done_ns(self.model.device) - t0) / 1e9, 1)
            self._graph = graph
            return self.info["compile_s"]

    def _prepare_graphs(self, tokenizer, capacity: int | None) -> float:
        """prepare() on a GPU: capture the static step's graphs for this request's bucket (each bucket
        once), and the first time check them against the uncaptured step."""
        with self._lock:
            reason = unavailable_reason(self.model)
            if reason:
                raise refusal(reason)
            static = cuda_graph.for_model(self.model)
            t0, first, before = clock.done_s(self.model.device), self._graph is None, len(static.captures)
            if not static.failed:  # a capture failed once: refused at once, not checked again per request
                if first:  # the uncaptured step is the model's own forward on a GPU: the check compares the two
                    graph = lambda tok, cache: forward.forward(self.model, [tok], [cache], graph=True)  # noqa: E731
                    self.info = self._check(graph, tokenizer)
                static.capture(cuda_graph.bucket((capacity or 0) + 2, self.model.max_context) or cuda_graph.MIN_BUCKET)
            if static.failed:
                raise InvalidRequest(f"compiled decode: {static.failed}. Turn Compiled step off.", "compiled_decode")
            self._graph = "cuda"
            spent = clock.done_s(self.model.device) - t0
            if first:
                self.info["capture_s"] = round(spent, 2)
            return spent if first or len(static.captures) > before else 0.0

    def _check(self, step, tokenizer, steps: int = 32) -> dict:
        """Teacher-force one quality text (engine/quant/quality.py) through the eager and the compiled step
        from the same prefix: how often they rank the same token first, the largest logit
        difference, and both steps' times (medians, alternating). Fused kernels round in their own
        order, so the two agree closely but not bit for bit (measured, never assumed)."""
        m = self.model
        ids = quality_inputs(tokenizer, 1)[0][: 16 + steps]
        prefix, steps = 16, len(ids) - 16
        eager_cache, graph_cache = m.new_cache(len(ids) + 1), m.new_cache(len(ids) + 1)
        for cache in (eager_cache, graph_cache):
            m.forward(torch.tensor(ids[:prefix], device=m.device), cache)
        diff, same, times = 0.0, 0, {"eager": [], "compiled": []}
        with torch.inference_mode():
            for s, tok in enumerate(ids[prefix:]):
                tok = torch.tensor([tok])
                t0 = clock.done_s(m.device)
                want = m.forward(tok, eager_cache)
                t1 = clock.done_s(m.device)
                got = step(tok, graph_cache)
                t2 = clock.done_s(m.device)
                if s:  # the first compiled call is the compile itself
                    times["eager"].append(t1 - t0)
                    times["compiled"].append(t2 - t1)
                diff = max(diff, float((got - want).abs().max()))
                same += int(got.argmax()) == int(want.argmax())
        eager, compiled = (statistics.median(times[k]) * 1e3 for k in ("eager", "compiled"))
        return {"top1_agreement": round(same / steps, 3), "positions": steps, "max_logit_diff": round(diff, 4),
                "eager_ms": round(eager, 2), "compiled_ms": round(compiled, 2), "ratio": round(compiled / eager, 3)}


def for_model(model) -> CompiledDecode:
    """The model's CompiledDecode (made once per model object, compiled by its `prepare`)."""
    compiled = getattr(model, "compiled_decode", None)
    if compiled is None:
        reason = unavailable_reason(model)
        if reason:
            raise refusal(reason)
        compiled = model.compiled_decode = CompiledDecode(model)
    return compiled


def info_for(model) -> dict | None:
    """What the model's compiled step measured when it was built (None: never compiled); on a GPU also
    its static step's pools and CUDA graph captures (engine/model/cuda_graph.py)."""
    compiled = getattr(model, "compiled_decode", None)
    static = getattr(model, "static_decode", None)
    if compiled is None or compiled.info is None:
        return {"graphs": static.describe()} if static is not None else None
    return {**compiled.info, "graphs": static.describe()} if static is not None else compiled.info
