"""THE forward: `Runner(model, plan)`, `runner.run(batch) -> logits`. Every logit the engine produces
comes from here: prefill chunks, decode steps, batched decode and speculative verification.

One runner per served model object (each weights variant, the draft model), made with its execution
plan (engine/runtime/plan.py) and held by whoever holds the variant (engine/serving/variants.py's
Variant, engine/speculative/draft.py's Draft): nothing is hung on the model. The step modes are ways
the runner executes the same layer loop (engine/runtime/blocks.py):
- eager (engine/runtime/eager.py): any batch; the layers in one C++ call where the plan says so;
- static (engine/runtime/cuda_graph.py): on a GPU, one token for each of a few sequences over static
  KV pools; with `Batch.mode` 'compiled' replayed from CUDA graphs;
- compiled (engine/runtime/compiled.py): on CPU, `Batch.mode` 'compiled' runs one sequence's one-token
  step through Inductor's graph, once `prepare` built it;
- transformers (engine/runtime/hf.py): the generic forward, for a model our forward does not know.
The compiled-step toggle reaches the runner as `Batch.mode` and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.core import clock
from engine.core.errors import InvalidRequest, LoadError, first_line
from engine.kernels import catalogue, cpu_layers
from engine.kernels.catalogue import Kernel
from engine.quant import w8a
from engine.runtime import compiled, cuda_graph, eager, hf
from engine.runtime.plan import Plan, make_plan

MODES = ("eager", "compiled")  # Batch.mode: the compiled-step toggle off / on


@dataclass(frozen=True)
class Batch:
    """One forward: each sequence's new tokens (ids or a 1-D tensor) and its KV cache."""

    rows: Sequence
    caches: Sequence
    all_logits: bool = False  # verification: every row's logits, not only each sequence's last
    mode: str = "eager"  # 'eager' | 'compiled' (the toggle: Inductor on CPU, CUDA graphs on a GPU)


class Runner:
    """Runs `model` (FastLlama or the transformers module) the way `plan` says."""

    def __init__(self, model, plan: Plan):
        self.model, self.plan = model, plan
        self._compiled: compiled.CompiledStep | None = None
        self._static: cuda_graph.StaticDecode | None = None
        self._graph_info: dict | None = None  # the CUDA graphs' check, once made
        self._graphs_ready = False
        self._lock = threading.Lock()
        w8a.tell(model, plan.w8a_form, plan.w8a_hardware_stream)  # the w8a layers' kernels: the plan's (before any forward)
        self._layers = (cpu_layers.layer_weights(model, plan.w8a_form, plan.head_norm, plan.w8a_hardware_stream)
                        if plan.cpp_rows else None)  # the C++ loop's
        self._prepare_weights()

    # --- what the decode loop asks of a model ---------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def max_context(self) -> int:
        return self.model.max_context

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def new_cache(self, capacity: int, kv: str = "model"):
        """A KV cache for a sequence of up to `capacity` positions, at precision `kv` (the kv_cache_dtype
        toggle; InvalidRequest where this model's forward keeps only its own dtype)."""
        if kv != "model" and self.plan.runner != "fast":
            raise InvalidRequest(f"kv_cache_dtype={kv} needs our Llama-family forward; this model runs the generic "
                                 "transformers one, whose cache keeps the model's dtype: use kv_cache_dtype=model",
                                 "kv_cache_dtype")
        return self.model.new_cache(capacity, kv) if kv != "model" else self.model.new_cache(capacity)

    # --- the forward ------------------------------------------------------------------------------
    def run(self, batch: Batch) -> torch.Tensor:
        """float32 logits: [B, vocab], each sequence's last row; with all_logits every row's, [R, vocab]."""
        rows, caches, plan = batch.rows, batch.caches, self.plan
        if plan.runner == "transformers":
            return hf.forward(self.model, rows, caches, batch.all_logits)
        lengths = [len(r) for r in rows]
        model_kv = all(getattr(c, "kind", "model") == "model" for c in caches)  # the static pools keep the model's dtype
        if plan.step_modes["static"] is None and model_kv and cuda_graph.serves(lengths, batch.all_logits):
            logits = self._static_step().step([r[0] for r in rows], caches, replay=batch.mode == "compiled")
            if logits is not None:
                return logits
        elif (batch.mode == "compiled" and self._compiled is not None and self._compiled.graph is not None
              and lengths == [1] and not batch.all_logits):
            return self._compiled.step(rows[0], caches[0])
        return eager.forward(self.model, plan, rows, caches, batch.all_logits, self._layers)

    def forward(self, ids, cache, all_logits: bool = False, mode: str = "eager") -> torch.Tensor:
        """`run` for one sequence: [T, vocab] with all_logits, else [1, vocab]."""
        return self.run(Batch([ids], [cache], all_logits, mode))

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One short prefill and decode step, so the first request does not pay one-time setup (and a
        variant that cannot run here fails now, not inside a request)."""
        cache = self.new_cache(8)
        ids = torch.tensor([0, 1, 2, 3], device=self.device)
        self.forward(ids, cache)
        self.forward(ids[:1], cache)

    # --- the compiled step mode --------------------------------------------------------------------
    @property
    def setup_stage(self) -> str:
        """The setup span `prepare` fills: Inductor compiles on CPU, CUDA graphs are captured on a GPU."""
        return "capture" if self.plan.compiled_mode == "cuda_graph" else "compile"

    def prepare(self, mode: str, tokenizer, capacity: int | None = None) -> float:
        """Make `mode` ready (compile the graph on CPU, capture the CUDA graphs of the bucket a cache of
        `capacity` positions steps in on a GPU), checked once against the eager step; returns the seconds
        it took (0.0: ready already, or nothing to do). Raises InvalidRequest where it cannot serve."""
        if mode != "compiled":
            return 0.0
        if self.plan.compiled_reason:
            raise compiled.refusal(self.plan.compiled_reason)
        if self.plan.compiled_mode == "cuda_graph":
            return self._prepare_graphs(tokenizer, capacity)
        with self._lock:
            if self._compiled is None:
                self._compiled = compiled.CompiledStep(self.model, self.plan)
        return self._compiled.prepare(lambda tok, cache: self.forward(tok, cache), tokenizer)

    def _static_step(self) -> cuda_graph.StaticDecode:
        with self._lock:
            if self._static is None:
                self._static = cuda_graph.StaticDecode(self.model, self.plan)
            return self._static

    def _prepare_graphs(self, tokenizer, capacity: int | None) -> float:
        """prepare() on a GPU: capture the static step's graphs for this request's bucket (each bucket
        once), and the first time check them against the uncaptured step."""
        static = self._static_step()
        with static._lock:
            t0, first, before = clock.done_s(self.device), self._graph_info is None, len(static.captures)
            if not static.failed:  # a capture failed once: refused at once, not checked again per request
                if first:
                    self._graph_info = compiled.check(self.model, lambda tok, c: self.forward(tok, c),
                                                      lambda tok, c: self.forward(tok, c, mode="compiled"), tokenizer)
                static.capture(cuda_graph.bucket((capacity or 0) + 2, self.max_context) or cuda_graph.MIN_BUCKET)
            if static.failed:
                raise InvalidRequest(f"compiled decode: {static.failed}. Turn Compiled step off.", "compiled_decode")
            spent = clock.done_s(self.device) - t0
            if first:
                self._graph_info["capture_s"] = round(spent, 2)
            return spent if first or len(static.captures) > before else 0.0

    def compiled_info(self) -> dict | None:
        """What the compiled step measured when it was built (None: never built); on a GPU also the static
        step's pools and CUDA graph captures."""
        info = self._graph_info if self.plan.compiled_mode == "cuda_graph" else (
            self._compiled.info if self._compiled is not None else None)
        graphs = self._static.describe() if self._static is not None else None
        if info is None:
            return {"graphs": graphs} if graphs is not None else None
        return {**info, "graphs": graphs} if graphs is not None else dict(info)

    # --- weight copies --------------------------------------------------------------------------------
    def _prepare_weights(self) -> None:
        """Make the weight copies the plan's short forwards read (panels, packed copies) now, not inside a
        request's first step; free the packed fp32 copies where the plan never reads them."""
        if self.plan.runner != "fast":
            return
        modules = {"qkv": [b.qkv for b in self.model.blocks], "o": [b.o for b in self.model.blocks],
                   "gate_up": [b.gate_up for b in self.model.blocks], "down": [b.down for b in self.model.blocks],
                   "lm_head": [self.model.lm_head]}
        packed_fp32 = False
        for role, lp in self.plan.linears.items():
            packed_fp32 |= lp.exact and any(k is Kernel.ONEDNN_PACKED for _, k in lp.buckets)
            for kernel in {lp.kernel(n) for n in (1, 2, 3)}:
                for module in modules[role]:
                    catalogue.prepare(kernel, module)
        if not packed_fp32:
            catalogue.drop_packed([m for ms in modules.values() for m in ms], torch.float32)


def open_runner(loaded, weights: str | None = None, what: str | None = None, **inject) -> Runner:
    """The runner of a loaded model (engine/model/loaded.py's LoadedModel): its plan made (measured
    choices kept in its cache folder), its weight copies made, warmed up. `weights`: the variant's name;
    `inject`: choices make_plan takes from a test or a bench. Raises LoadError where it cannot run
    (`what`: how its message names the weights)."""
    plan = make_plan(loaded.model, loaded.device, cache_dir=getattr(loaded, "cache_dir", None),
                     weights=weights or loaded.dtype_name, **inject)
    runner = Runner(loaded.model, plan)
    try:
        runner.warm_up()
    except Exception as exc:
        raise LoadError(f"{what or f'weights {plan.weights!r}'} cannot run on {loaded.device} with this model: "
                        f"{type(exc).__name__}: {first_line(exc)}") from exc
    return runner
