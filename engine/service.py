"""`Engine`: a loaded model plus the worker that serves it — what the CLI, API and page hold.

`engine.prefix_cache.stats()` gives the KV-reuse figures (hit rates, bytes, entries) for the page and API.
"""

from __future__ import annotations

from .config import GenerationConfig, LoadConfig
from .generate import Event, Request
from .loader import LoadedModel, cache_root, load
from .machine_limits import MachineLimits, load_or_measure, probe_dtypes
from .prefix_cache import PrefixCache
from .timeline import Timeline
from .variants import VariantSet
from .worker import RequestHandle, Worker


class Engine:
    def __init__(self, loaded: LoadedModel, max_queue: int | None = None, prefix_cache: PrefixCache | None = None,
                 variants: tuple[str, ...] = (), variants_budget_bytes: int | None = None,
                 machine_limits: MachineLimits | None = None, cache_dir=None):
        """`variants`: quantization variants to build now (others are built on first use).
        `machine_limits`: the machine's measured ceilings for the roofline (None: fractions stay None
        until `remeasure_limits`); `cache_dir`: where `remeasure_limits` caches them."""
        self.loaded = loaded
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.variants = VariantSet(loaded, budget_bytes=variants_budget_bytes)
        self.variants.preload(variants)
        self.worker = Worker(loaded, max_queue=max_queue, prefix_cache=self.prefix_cache, variants=self.variants)
        self.cache_dir = cache_dir
        self.worker.machine_limits = machine_limits

    @classmethod
    def load(cls, config: LoadConfig = LoadConfig(), max_queue: int | None = None) -> Engine:
        cache = PrefixCache(config.kv_cache_mb, shared=config.shared_prefix_cache)
        budget = int(config.variants_budget_mb * 1e6) if config.variants_budget_mb else None
        loaded = load(config)
        limits = load_or_measure(cache_root(config), loaded.device, probe_dtypes(loaded.dtype_name))
        return cls(loaded, max_queue=max_queue, prefix_cache=cache, variants=config.variants,
                   variants_budget_bytes=budget, machine_limits=limits, cache_dir=cache_root(config))

    @property
    def machine_limits(self) -> MachineLimits | None:
        return self.worker.machine_limits

    def remeasure_limits(self, seconds: float = 1.5) -> MachineLimits:
        """Probe the machine again (the page's button) and cache the result. It shares the CPU with
        a reply that is running, so run it when the engine is idle for a clean figure."""
        limits = load_or_measure(self.cache_dir, self.loaded.device, probe_dtypes(self.loaded.dtype_name),
                                 force=True, seconds=seconds)
        self.worker.machine_limits = limits
        return limits

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
        limits = self.machine_limits
        return {**self.loaded.info(), "prefix_cache": self.prefix_cache.stats(), "variants": self.variants.report(),
                "machine_limits": limits.to_dict() if limits else None}

    def close(self) -> None:
        self.worker.close()
