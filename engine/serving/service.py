"""`Engine`: a loaded model plus the worker that serves it — what the CLI, API and page hold.

The measuring tools sit above it: an entry point (engine/lab.py `open_engine`) attaches the machine's
limits (`limits`, a publisher the worker calls as each reply finishes: `on_done`).

`engine.serving.prefix_cache.stats()` gives the KV-reuse figures (hit rates, bytes, entries) for the page and API.
"""

from __future__ import annotations

import torch

from engine.core.config import SPECULATIVE_MODES, TOGGLES, GenerationConfig, LoadConfig
from engine.core.info import EngineInfo, SpeculationInfo
from engine.core.request import Event, Request, RequestHandle
from engine.core.timeline import Timeline
from engine.core.errors import LatencyLabError
from engine.kernels.catalogue import packed_bytes
from engine.model.loaded import LoadedModel
from engine.platform import capabilities
from engine.model.loader import load
from engine.serving.variants import VariantSet
from engine.serving import kv_budget
from engine.serving.prefix_cache import PrefixCache
from engine.serving.worker import Worker
from engine.speculative.draft import load_draft


class Engine:
    def __init__(self, loaded: LoadedModel, max_queue: int | None = None, prefix_cache: PrefixCache | None = None,
                 variants: tuple[str, ...] = (), variants_budget_bytes: int | None = None, max_batch: int = 1):
        """`variants`: quantization variants to build now (others are built on first use).
        `max_batch`: requests the worker runs at once (continuous batching, engine/serving/scheduler.py);
        1: one request at a time. The machine's limits are attached by the entry point (engine/lab.py):
        until then the roofline's fractions stay unknown."""
        self.loaded = loaded
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.variants = VariantSet(loaded, budget_bytes=variants_budget_bytes, defer_quality=True)
        self.variants.preload(variants)
        self.worker = Worker(loaded, max_batch=max_batch, max_queue=max_queue, prefix_cache=self.prefix_cache,
                             variants=self.variants)
        self.limits = None  # what the entry point attached (engine/lab.py): the machine's limits, their publisher

    @classmethod
    def load(cls, config: LoadConfig = LoadConfig(), max_queue: int | None = None) -> Engine:
        """The model and its draft as `config` names them, served (no measuring tools attached:
        engine/lab.py `open_engine` attaches them)."""
        budget = int(config.variants_budget_mb * 1e6) if config.variants_budget_mb else None
        loaded = load(config)
        loaded.draft = load_draft(config.draft_model, loaded)
        cache = kv_budget.prefix_cache(config.kv_cache_mb, loaded.device, shared=config.shared_prefix_cache)
        return cls(loaded, max_queue=max_queue, prefix_cache=cache, variants=config.variants,
                   variants_budget_bytes=budget, max_batch=config.max_batch)

    def on_done(self, fn) -> None:
        """Call `fn(timeline, variant)` in the worker thread as each reply finishes, before its done event
        goes out: how the measuring tools above the runtime stamp their figures on it."""
        self.worker.on_done.append(fn)

    def on_idle(self, fn) -> None:
        """Call `fn()` in the worker thread when it has nothing queued or running (returns whether it did
        work): how the measuring tools re-probe without taking time from a reply."""
        self.worker.on_idle.append(fn)

    @property
    def machine_limits(self):
        """The attached machine limits (engine/measure/machine_limits.py), None where none are."""
        return getattr(self.limits, "limits", None)

    def remeasure_limits(self, seconds: float = 3.0):
        """Probe the machine again (the page's button) and cache the result. It shares the CPU with
        a reply that is running, so run it when the engine is idle for a clean figure."""
        if self.limits is None:
            raise LatencyLabError("no machine limits are attached to this engine (open it with engine.lab.open_engine)")
        return self.limits.remeasure(self.loaded.device, self.loaded.dtype_name, seconds)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def submit(self, messages: list[dict] | None = None, config: GenerationConfig | None = None, *,
               prompt_ids: list[int] | None = None, session: str | None = None,
               timeline: Timeline | None = None, batch_scope: str | None = None) -> RequestHandle:
        request = Request(messages=messages, prompt_ids=prompt_ids, config=config or GenerationConfig(),
                          session=session, batch_scope=batch_scope)
        return self.worker.submit(request, timeline)

    def open_batch_scope(self, limit: int) -> str:
        """A run-scoped max batch for the requests that name the id (engine/serving/worker.py)."""
        return self.worker.open_batch_scope(limit)

    def close_batch_scope(self, scope: str) -> None:
        self.worker.close_batch_scope(scope)

    def complete(self, messages: list[dict], config: GenerationConfig | None = None, **kw) -> Event:
        """Blocking: the done event (text, token ids, timeline). Raises the request's error."""
        return self.submit(messages, config, **kw).result()

    def info(self) -> EngineInfo:
        lm, plan = self.loaded, self.variants.default.runner.plan
        draft_missing = None if lm.draft is not None else (
            "no draft model is loaded: start the engine with --draft-model PATH (the bundled draft matches "
            "only the bundled model)")
        return EngineInfo(
            name=lm.name, source=lm.source, path=lm.path, dtype=lm.dtype_name, device=str(lm.device),
            device_reason=lm.device_reason,
            threads=torch.get_num_threads() if lm.device.type == "cpu" else None, context_max=lm.max_context,
            weight_bytes=lm.weight_bytes(), load_s=round(lm.load_s, 3), fast_path=lm.fast_path,
            decode_attention=plan.attention_text if lm.fast_path else None,
            kv_cache_attention=plan.kv_attention_text if lm.fast_path else None,
            layer_loop=plan.layer_loop_text if lm.fast_path else None,
            kernels=plan.describe() if lm.fast_path else None,
            notes=(*lm.notes, *plan.notes()), variants=self.variants.infos(),
            speculation=tuple(SpeculationInfo(m, m != "draft" or draft_missing is None,
                                              draft_missing if m == "draft" else None) for m in SPECULATIVE_MODES),
            toggles=tuple(t.name for t in TOGGLES), capabilities=capabilities.detect().to_dict(),
            unavailable_toggles={"compiled_decode": why} if (why := plan.compiled_machine_reason) else {},
            prefix_cache=self.prefix_cache.stats(), variant_budget_bytes=self.variants.budget_bytes,
            packed_weight_bytes=packed_bytes(), draft=lm.draft.info() if lm.draft is not None else None,
            machine_limits=self.limits.to_dict() if self.limits is not None else None,
            batching=self.worker.batching_info())

    def close(self) -> None:
        self.worker.close()
