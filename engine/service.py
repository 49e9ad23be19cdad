"""`Engine`: a loaded model plus the worker that serves it — what the CLI, API and page hold.

`engine.prefix_cache.stats()` gives the KV-reuse figures (hit rates, bytes, entries) for the page and API.
"""

from __future__ import annotations

from .config import GenerationConfig, LoadConfig
from .generate import Event, Request
from .loader import LoadedModel, load
from .prefix_cache import PrefixCache
from .timeline import Timeline
from .variants import VariantSet
from .worker import RequestHandle, Worker


class Engine:
    def __init__(self, loaded: LoadedModel, max_queue: int | None = None, prefix_cache: PrefixCache | None = None,
                 variants: tuple[str, ...] = (), variants_budget_bytes: int | None = None, max_batch: int = 1):
        """`variants`: quantization variants to build now (others are built on first use).
        `max_batch` > 1: continuous batching (engine/scheduler.py); 1: one request at a time."""
        self.loaded = loaded
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.variants = VariantSet(loaded, budget_bytes=variants_budget_bytes)
        self.variants.preload(variants)
        if max_batch > 1:
            from .scheduler import BatchingWorker

            self.worker = BatchingWorker(loaded, max_batch, max_queue=max_queue, prefix_cache=self.prefix_cache,
                                         variants=self.variants)
        else:
            self.worker = Worker(loaded, max_queue=max_queue, prefix_cache=self.prefix_cache, variants=self.variants)

    @classmethod
    def load(cls, config: LoadConfig = LoadConfig(), max_queue: int | None = None) -> Engine:
        cache = PrefixCache(config.kv_cache_mb, shared=config.shared_prefix_cache)
        budget = int(config.variants_budget_mb * 1e6) if config.variants_budget_mb else None
        return cls(load(config), max_queue=max_queue, prefix_cache=cache, variants=config.variants,
                   variants_budget_bytes=budget, max_batch=config.max_batch)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def submit(self, messages: list[dict] | None = None, config: GenerationConfig | None = None, *,
               prompt_ids: list[int] | None = None, session: str | None = None,
               timeline: Timeline | None = None) -> RequestHandle:
        request = Request(messages=messages, prompt_ids=prompt_ids, config=config or GenerationConfig(),
                          session=session)
        return self.worker.submit(request, timeline)

    def complete(self, messages: list[dict], config: GenerationConfig | None = None, **kw) -> Event:
        """Blocking: the done event (text, token ids, timeline). Raises the request's error."""
        return self.submit(messages, config, **kw).result()

    def info(self) -> dict:
        info = {**self.loaded.info(), "prefix_cache": self.prefix_cache.stats(), "variants": self.variants.report()}
        batching = getattr(self.worker, "batching_info", None)
        if batching is not None:  # only with --max-batch > 1: at 1 the info is what it always was
            info["batching"] = batching()
        return info

    def close(self) -> None:
        self.worker.close()
