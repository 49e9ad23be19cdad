"""`EngineInfo`: the one typed description of an engine that the page, the API and the bench read.

An engine (local, remote, or the paced test source) returns one from `info()`; it travels as JSON
through `to_dict()` / `from_dict()` (a remote Latency Lab sends its own in its model card), so
every reader sees the same fields. Values an engine cannot know are None, never 0.
No torch here: the page and the API import this without the decode loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(frozen=True)
class VariantInfo:
    """One weights variant the engine can serve (`GenerationConfig.quantization` names it)."""

    name: str
    method: str  # what it is: "unquantized fp32 (as loaded)", "bitsandbytes 4-bit NormalFloat …"
    default: bool = False  # the variant the engine loaded; requests that name none get it
    available: bool = True  # False: this machine or model cannot run it (see `reason`)
    reason: str | None = None  # why it is unavailable, and what to pick instead
    resident: bool = False  # built and held in memory now (others are built on first use)
    weight_bytes: int | None = None  # known once built
    decode_tps: float | None = None  # medians over recently served requests
    prefill_tps: float | None = None
    top1_agreement: float | None = None  # against the default variant (engine/quant/quality.py)
    mean_kl: float | None = None
    build_s: float | None = None
    decode_kernels: str | None = None  # weight-only variants: which kernels their decode steps run (the plan's weight_only_text)
    kernel_fallback: str | None = None  # w8a variants: why the plan runs the torch reference here, not our integer kernels
    compiled_step: dict | None = None  # its compiled decode step, once built: agreement and times (engine/runtime/compiled.py)
    compiled_refused: str | None = None  # why these weights cannot take the compiled step (known once built)


@dataclass(frozen=True)
class SpeculationInfo:
    """One value of the `speculative` toggle and whether this engine can run it."""

    name: str
    available: bool = True
    reason: str | None = None


@dataclass(frozen=True)
class EngineInfo:
    name: str
    source: str  # bundled | gguf | folder | hub | remote | paced
    path: str | None = None
    dtype: str | None = None
    device: str | None = None
    device_reason: str | None = None  # why this device serves, in one line (engine/platform/device.py)
    threads: int | None = None
    context_max: int | None = None  # the model's context window (tokens)
    weight_bytes: int | None = None  # the default variant's
    load_s: float | None = None
    fast_path: bool | None = None
    decode_attention: str | None = None  # what a decode row's attention runs on (cpu_attention.kernel_name); None: generic forward
    kv_cache_attention: str | None = None  # what reads a cache kept at fp16/bf16/int8 (kv_cache_dtype); None: generic forward
    layer_loop: str | None = None  # where the fast path's layer loop runs (cpu_layers.describe); None: generic forward
    kernels: dict | None = None  # the projections' kernels for prefill and decode, and why (engine/runtime/plan.py Plan.describe: the plan)
    notes: tuple[str, ...] = ()
    variants: tuple[VariantInfo, ...] = ()
    speculation: tuple[SpeculationInfo, ...] = ()
    toggles: tuple[str, ...] = ()  # the GenerationConfig toggles this engine honours
    unavailable_toggles: dict = field(default_factory=dict)  # toggle name -> why no variant can switch it on here
    capabilities: dict | None = None  # engine.platform.capabilities.Capabilities.to_dict(): what the machine can do
    prefix_cache: dict | None = None  # engine.serving.prefix_cache.PrefixCache.stats()
    variant_budget_bytes: int | None = None
    packed_weight_bytes: int | None = None  # oneDNN copies of bf16 weights for multi-row matmuls
    draft: dict | None = None  # the speculative draft model, if one is loaded
    machine_limits: dict | None = None  # engine.measure.machine_limits.MachineLimits.to_dict(): the roofline's ceilings
    batching: dict | None = None  # with --max-batch > 1: the scheduler's settings (engine/serving/scheduler.py)
    extra: dict = field(default_factory=dict)  # facts of one backend only (e.g. a remote's base URL)

    @property
    def default_variant(self) -> VariantInfo | None:
        return next((v for v in self.variants if v.default), None)

    def variant(self, name: str | None) -> VariantInfo | None:
        """The variant a request's `quantization` names (None: the default)."""
        if name is None:
            return self.default_variant
        return next((v for v in self.variants if v.name == name), None)

    def exact_replies(self, variant: str | None = None) -> bool:
        """Whether a request's greedy (or seeded) reply here is promised token for token the same alone,
        in a batch and after KV reuse: the fp32 weights as loaded, on a local CPU engine, whose kernels
        give a row the same bits whatever shares its forward (docs/batching.md). In bf16 and quantized
        weights a batch or a cached prefix may round a near-tie the other way; a remote server promises nothing."""
        chosen = self.variant(variant)
        return (self.source not in ("remote", "paced") and self.dtype == "fp32" and (self.device or "").startswith("cpu")
                and chosen is not None and chosen.default)

    def headline(self) -> str:
        """One line for the page header: 'SmolLM2-135M-Instruct · fp32 · cpu: --device cpu asked for · 2 threads ·
        538 MB weights' (the device with its reason where the engine gives one)."""
        parts = [self.name]
        parts += [p for p in (self.dtype, self.device_reason or self.device) if p]
        if self.threads:
            parts.append(f"{self.threads} threads")
        if self.weight_bytes:
            parts.append(f"{self.weight_bytes / 1e6:,.0f} MB weights")
        if self.batching and self.batching.get("max_batch", 1) > 1:  # --max-batch N (docs/batching.md)
            parts.append(f"continuous batching, max batch {self.batching['max_batch']} (speculative and compiled-step requests unbatched)")
        return " · ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EngineInfo:
        """Read what `to_dict` wrote (e.g. a remote Latency Lab's model card); unknown keys go to `extra`."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["notes"] = tuple(kw.get("notes") or ())
        kw["toggles"] = tuple(kw.get("toggles") or ())
        kw["variants"] = tuple(VariantInfo(**_only(VariantInfo, v)) for v in kw.get("variants") or ())
        kw["speculation"] = tuple(SpeculationInfo(**_only(SpeculationInfo, s)) for s in kw.get("speculation") or ())
        kw["extra"] = {**(kw.get("extra") or {}), **{k: v for k, v in d.items() if k not in known}}
        return cls(**kw)


def _only(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}
