"""Several variants of the loaded model held at once, for A/B: each request names the one it wants.

`VariantSet` starts with the loaded model — the default variant, named by its dtype — and builds
any other (engine/quant/quantize.py, `build`) the first time a request asks for it, or at start for the
names given to `preload`; then it keeps it. Each variant holds its runner (engine/runtime/runner.py),
made with the variant's execution plan when it is loaded or built. Built variants stay resident while their weights together
(tensors shared between variants counted once) fit the memory budget; past it, the least
recently used variant (never the default) is dropped, and rebuilt if asked for again. A variant
the device or the model cannot run fails its requests with one LoadError — remembered, so later
requests fail at once — while every other variant keeps working.

Threads: `get`, `preload` and `record` run on the worker thread, the one that owns the models;
`check` and `report` may run on any thread.
"""

from __future__ import annotations

import logging
import resource
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import psutil
from torch import nn

from engine.core.errors import LoadError
from engine.core.info import VariantInfo
from engine.kernels import cpu_gemm
from engine.kernels.catalogue import Kernel
from engine.model.loaded import LoadedModel, weight_bytes
from engine.platform import capabilities
from engine.platform.device_memory import device_memory
from engine.quant import quantize
from engine.quant.quality import compare, next_token_logits, quality_inputs
from engine.quant.quantize import METHODS, check_name, describe
from engine.runtime.activations import weight_only_activations
from engine.runtime.plan import w8a_form
from engine.runtime.runner import Runner, open_runner

log = logging.getLogger(__name__)
RECENT = 20  # served requests per variant whose speeds the report's medians cover
DEFAULT_BUDGET_FACTOR = 3  # default budget: 3x the default variant's weights


@dataclass
class Variant:
    name: str
    method: str
    loaded: LoadedModel
    runner: Runner  # the variant's forward, with its execution plan
    build_s: float
    weight_bytes: int  # real storage of this variant's model, shared tensors included
    memory_bytes: int  # memory where it lives right after it was built: GPU allocations on CUDA, else the process's RSS
    peak_memory_bytes: int  # the peak of the same so far, right after it was built
    quality: dict | None = None  # top1_agreement, mean_kl, positions: against the default variant
    decode_tps: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    prefill_tps: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    requests: int = 0
    last_used: float = field(default_factory=time.monotonic)

    def report(self) -> dict:
        q = self.quality or {}
        return {
            "name": self.name,
            "method": self.method,
            "dtype": self.loaded.dtype_name,
            "device": str(self.loaded.device),
            "weight_bytes": self.weight_bytes,
            "build_s": round(self.build_s, 3),
            "memory": "gpu" if self.loaded.device.type == "cuda" else "host",
            "memory_bytes": self.memory_bytes,
            "peak_memory_bytes": self.peak_memory_bytes,
            "decode_tps": _median(self.decode_tps),  # medians over recent served requests
            "prefill_tps": _median(self.prefill_tps),
            "requests": self.requests,
            "top1_agreement": q.get("top1_agreement"),
            "mean_kl": q.get("mean_kl"),
            "quality_positions": q.get("positions"),
            "perplexity": q.get("perplexity"),  # on the quality set's answers (the default's: reference_perplexity)
        }


class VariantSet:
    def __init__(self, default: LoadedModel, budget_bytes: int | None = None, quality_texts: int | None = None,
                 defer_quality: bool = False):
        """`budget_bytes`: weights of all resident variants together (default: 3x the default's).
        `quality_texts`: how many of quality.QUALITY_SET to measure each variant on (0: none).
        `defer_quality`: measure a new variant's quality later (`measure_pending`, which the engine's
        worker calls when it is idle), not inside the request that asked for the variant: the quality
        forward can take minutes on a small CPU (docs/quantization.md), and it is no part of that
        request's latency."""
        self.default_name = default.dtype_name
        self.quality_texts = quality_texts
        self.defer_quality = defer_quality
        self._pending_quality: list[str] = []
        self._lock = threading.RLock()  # report() reads what the worker thread writes
        self._failed: dict[str, str] = {}
        self._reference = None  # the default variant's logits on the quality set
        self.evictions = 0
        runner = open_runner(default)
        first = Variant(self.default_name, f"unquantized {self.default_name} (as loaded)", default, runner,
                        default.load_s, weight_bytes(default.model), *_memory(default.device))
        first.quality = {"top1_agreement": 1.0, "mean_kl": 0.0, "positions": None}
        self._built: dict[str, Variant] = {self.default_name: first}
        self.budget_bytes = budget_bytes or DEFAULT_BUDGET_FACTOR * first.weight_bytes

    @property
    def default(self) -> Variant:
        return self._built[self.default_name]

    def names(self) -> list[str]:
        return [self.default_name, *(n for n in METHODS if n != self.default_name)]

    def check(self, name: str | None) -> str:
        """The variant a request's `quantization` names (None: the default); InvalidRequest if unknown."""
        if name is None or name == "" or name == self.default_name:
            return self.default_name
        return check_name(name, self.names())

    def is_resident(self, name: str | None) -> bool:
        return self.check(name) in self._built

    def get(self, name: str | None) -> Variant:
        """The variant, built now if it is not resident. Raises LoadError if it cannot run."""
        name = self.check(name)
        with self._lock:
            variant = self._built.get(name)
        if variant is None:
            variant = self._build(name)
        variant.last_used = time.monotonic()
        return variant

    def preload(self, names) -> None:
        """Build these variants now. Unknown names raise; one that cannot run is logged and skipped."""
        for name in names:
            try:
                self.get(name)
            except LoadError as exc:
                log.warning("variant %s is unavailable: %s", name, exc)

    def record(self, name: str, timeline) -> None:
        """Note a finished request's speeds against the variant that served it."""
        with self._lock:
            variant = self._built.get(name)
            if variant is None:
                return
            variant.requests += 1
            if timeline.decode_tps:
                variant.decode_tps.append(timeline.decode_tps)
            if timeline.prefill_ms and timeline.prefill_tokens:
                variant.prefill_tps.append(timeline.prefill_tokens / (timeline.prefill_ms / 1e3))

    def resident(self) -> list[Variant]:
        """Every resident variant, the default first."""
        with self._lock:
            return list(self._built.values())

    def resident_bytes(self) -> int:
        with self._lock:
            models = [v.loaded.model for v in self._built.values()]
        return weight_bytes(nn.ModuleList(models))  # each storage once: variants share unquantized tensors

    def report(self) -> dict:
        with self._lock:
            built = list(self._built.values())
            return {
                "default": self.default_name,
                "available": self.names(),
                "resident": [v.name for v in built],
                "resident_bytes": self.resident_bytes(),
                "budget_bytes": self.budget_bytes,
                "evictions": self.evictions,
                "failed": dict(self._failed),
                "variants": [v.report() for v in built],
            }

    def infos(self) -> tuple[VariantInfo, ...]:
        """Every variant this engine offers, the default first: built ones with their figures, the
        others with whether this machine can run them (and if not, why)."""
        with self._lock:
            built, failed = dict(self._built), dict(self._failed)
        out = []
        for name in self.names():
            reason = failed.get(name) or precheck(self.default.loaded, name)
            v = built.get(name)
            plan = v.runner.plan if v else None
            r = v.report() if v else {}
            out.append(VariantInfo(
                name=name, method=v.method if v else describe(name, self.default.loaded.device), default=name == self.default_name,
                available=reason is None, reason=reason, resident=v is not None, weight_bytes=r.get("weight_bytes"),
                decode_tps=r.get("decode_tps"), prefill_tps=r.get("prefill_tps"),
                top1_agreement=r.get("top1_agreement"), mean_kl=r.get("mean_kl"), build_s=r.get("build_s"),
                decode_kernels=plan.weight_only_text if plan else None,
                kernel_fallback=None if reason else self._kernel_fallback(name, plan),
                compiled_step=v.runner.compiled_info() if v else None,
                compiled_refused=(None if plan.compiled_machine_reason else plan.compiled_reason) if plan else None))
        return tuple(out)

    def _kernel_fallback(self, name: str, plan) -> str | None:
        """Why w8a variant `name` runs the torch reference here rather than our integer kernels (None: it
        runs them, or it is no w8a variant): the plan's rule, and once built its plan's own form. For bf16wo,
        why its products widen the weights each time rather than run our panel kernel."""
        method = quantize.split_name(name)[0]
        if method in quantize.FP32_ACTIVATIONS:
            if plan is not None:
                return None if plan.linears["qkv"].kernel(1) is Kernel.OURS_BF16W else "its plan chose ATen"
            why = cpu_gemm.unavailable_reason()
            return f"our panel kernel does not run here ({why}): each product would widen the weights first" if why else None
        if method not in quantize.INT8_ACTIVATIONS:
            return None
        if plan is not None and plan.w8a_form:
            return None
        form, why = w8a_form(self.default.loaded.device.type, capabilities.detect())
        return why if form is None else ("its plan chose the torch reference" if plan is not None else None)

    # --- building (worker thread) -----------------------------------------------------------
    def _build(self, name: str) -> Variant:
        if name in self._failed:
            raise LoadError(self._failed[name])
        try:
            loaded, runner = build(self.default.loaded, name)
        except LoadError as exc:
            self._failed[name] = str(exc)
            raise
        variant = Variant(name, describe(name, loaded.device), loaded, runner, loaded.load_s, weight_bytes(loaded.model),
                          *_memory(loaded.device))
        if self.defer_quality:
            self._pending_quality.append(name)
        else:
            variant.quality = self._quality(runner)
        with self._lock:
            self._built[name] = variant
        self._fit_budget(variant)
        return variant

    def measure_pending(self) -> bool:
        """Measure the quality of one variant built with its measurement deferred (worker thread).
        Returns whether one was measured (False: none pending)."""
        while self._pending_quality:
            name = self._pending_quality.pop(0)
            with self._lock:
                variant = self._built.get(name)
            if variant is not None:  # an evicted variant is measured again when it is rebuilt
                variant.quality = self._quality(variant.runner)
                return True
        return False

    def _quality(self, runner) -> dict | None:
        if self.quality_texts == 0:
            return None
        inputs = quality_inputs(self.default.loaded.tokenizer, self.quality_texts)
        if self._reference is None:
            self._reference = next_token_logits(self.default.runner, inputs)
        return compare(self._reference, next_token_logits(runner, inputs), inputs)

    def _fit_budget(self, new: Variant) -> None:
        while self.resident_bytes() > self.budget_bytes:
            with self._lock:
                others = [v for v in self._built.values() if v.name not in (self.default_name, new.name)]
                if not others:
                    del self._built[new.name]
                    message = (f"variant {new.name!r} ({new.weight_bytes / 1e6:.0f} MB of weights) does not fit "
                               f"the variants' memory budget of {self.budget_bytes / 1e6:.0f} MB beside the default "
                               f"{self.default_name!r} ({self.default.weight_bytes / 1e6:.0f} MB); "
                               "raise --variants-budget-mb")
                    self._failed[new.name] = message
                    raise LoadError(message)
                victim = min(others, key=lambda v: v.last_used)
                del self._built[victim.name]
                self.evictions += 1
            log.info("variant %s dropped to fit the memory budget", victim.name)


def activations(base: LoadedModel, name: str) -> dict:
    """The activation dtype of each weight-only method variant `name` uses (the plan's decision,
    engine/runtime/plan.py), after the checks that refuse it without building (LoadError)."""
    method, head = quantize.split_name(name)
    out = {}
    for m in {method, head} & set(quantize.WEIGHT_ONLY):
        quantize.check_weight_only(m, base, m == head)
        out[m] = weight_only_activations(m, base.device, base.dtype, quantize.weight_only_shapes(m, base, m == head),
                                         base.cache_dir)
    return out


def build(base: LoadedModel, name: str, quantize_lm_head: bool = False) -> tuple[LoadedModel, Runner]:
    """Variant `name` of `base`, and its runner: the layers built in the activation dtype the plan decided,
    the variant's plan made (its measured choices cached per machine), a short forward run through it.
    Raises InvalidRequest for an unknown name and LoadError for one this device or model cannot run."""
    check_name(name)
    loaded = quantize.build_variant(base, name, activations(base, name), quantize_lm_head=quantize_lm_head)
    runner = open_runner(loaded, weights=name, what=f"quantization {name!r}")
    loaded.notes = [*loaded.notes, *(f"variant {name}: {n}" for n in runner.plan.notes())]
    return loaded, runner


def precheck(base: LoadedModel, name: str) -> str | None:
    """Why variant `name` cannot run here, known without building it (None: nothing known against it):
    quantize.precheck's checks and, for a weight-only variant, whether its kernel runs (the plan's
    activation probe). The page shows such a variant disabled with this reason."""
    reason = quantize.precheck(base, name)
    if reason is None and quantize.split_name(name)[0] in quantize.WEIGHT_ONLY:
        try:
            activations(base, name)
        except LoadError as exc:
            return str(exc)
    return reason


def _memory(device) -> tuple[int, int]:
    """(current, peak) memory where a variant on `device` lives, in bytes: torch's GPU allocations on
    CUDA (engine/platform/device_memory.py), else this process's resident memory."""
    on_device = device_memory(device)
    if on_device is not None:
        return on_device["allocated_bytes"], on_device["peak_allocated_bytes"]
    return psutil.Process().memory_info().rss, peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident memory. Linux's VmHWM, not getrusage's ru_maxrss: a process
    started by fork+exec inherits its parent's ru_maxrss, so a child's figure can be the parent's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _median(values) -> float | None:
    return round(statistics.median(values), 2) if values else None
