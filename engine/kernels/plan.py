"""The fp32 one-row decision (`choose.Plan`): a rule where our kernel builds, else measured once
per machine and read from a cache.

Where our panel kernel builds, it serves every sequence of up to choose.OURS_ROWS rows, by rule, not
by a race: it gives a row the same bits at any row count and reads the weights once for a whole
batch, which continuous batching needs (a row-variant winner of a one-row race, MKL's GEMV, must run
each sequence of a batch on its own). `python -m engine.bench bandwidth` prints a one-row step through
each kernel on the machine at hand.

Elsewhere, which of MKL's GEMV and oneDNN's packed copy runs a one-row fp32 product faster depends on
the CPU and the thread count, so it is measured: a few one-token decode steps through each,
alternating (paired per round: a neighbour's load slows all), keeping the faster. The packed copy
must beat GEMV by ONE_ROW_PACKED_IF (it costs memory).

Why cached: a measurement on a shared machine can come out either way between runs, and the
decision changes the bits of fp32 logits (each kernel sums in its own order). Cached per machine
and model shape (CPU model and flags, torch's dispatch level and version, threads, the model's
dimensions, the kernels that build here), in the engine's cache folder next to the machine limits
(engine/measure/machine_limits.py), a restart takes the same kernels and gives the same bits. Tests inject a decision with `inject`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from pathlib import Path

import torch

from engine.kernels import choose, cpu_gemm
from engine.kernels.choose import Plan
from engine.platform import capabilities

log = logging.getLogger(__name__)
ONE_ROW_PACKED_IF = 0.95  # packed step / GEMV step at or below this: single rows go packed too
FILE_VERSION = 2  # 2: {key, decision, measured_at}, shared by every cached kernel decision
NAMES = {"packed": "packed oneDNN weights", "gemv": "MKL GEMV", "ours": "our panel kernel"}


def inject(model, one_row: str) -> Plan:
    """Set `model`'s decision by hand (tests, benches comparing kernels); returns it."""
    if one_row not in NAMES:
        raise ValueError(f"one_row must be one of {sorted(NAMES)}, not {one_row!r}")
    model.kernel_plan = Plan(one_row=one_row, source="injected")
    if one_row == "ours":
        choose.drop_packed(model, torch.float32)  # ours takes every row count the packed fp32 copies served
    return model.kernel_plan


def candidates(model) -> list[str] | None:
    """The one-row kernels to choose between for `model` here (None: nothing to choose: not an fp32
    CPU model, or oneDNN cannot pack fp32 here)."""
    if model.dtype != torch.float32 or model.device.type != "cpu" or choose.packed_weight(model.lm_head) is None:
        return None
    return ["gemv", "packed"] + (["ours"] if cpu_gemm.available() else [])


def machine_key(model) -> dict:
    """What a measured kernel decision for `model` depends on: the machine, torch, the threads and
    the model's shape."""
    cfg = model.config
    shape = [getattr(cfg, a, None) for a in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads", "vocab_size")]
    caps = capabilities.detect()
    return {"cpu_model": caps.cpu_model, "isa": sorted(caps.isa), "cpu_capability": caps.torch_cpu_capability,
            "threads": torch.get_num_threads(), "torch": torch.__version__.split("+")[0], "model_shape": shape}


def key(model) -> dict:
    """The fp32 one-row decision's key: the machine and model (`machine_key`) and the kernels."""
    return {**machine_key(model), "candidates": candidates(model)}


def cache_file(cache_dir: Path, k: dict, folder: str = "kernel-plans") -> Path:
    digest = hashlib.sha1(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / folder / f"{digest}.json"


def cached(cache_dir: Path | None, folder: str, k: dict, measure_now, valid=lambda d: True,
           force: bool = False) -> tuple[dict, str]:
    """A measured kernel decision, kept per machine: the one stored under `<cache_dir>/<folder>/` for
    key `k` (where `valid` accepts it), else `measure_now()` (a JSON-able dict), stored there.
    Returns (decision, source): "cached (DATE)" or "measured". Every measured kernel decision goes
    through here (this one-row plan; weight-only variants' kernels, engine/quant/weight_only.py)."""
    path = cache_file(cache_dir, k, folder) if cache_dir else None
    if path and path.is_file() and not force:
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") == FILE_VERSION and raw["key"] == k and valid(raw["decision"]):
                return raw["decision"], f"cached ({raw['measured_at'][:10]})"
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("ignoring unreadable kernel decision %s: %s", path, exc)
    decision = measure_now()
    if path:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"version": FILE_VERSION, "key": k, "decision": decision,
                                       "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
            tmp.replace(path)
        except OSError as exc:
            log.warning("could not cache the kernel decision at %s: %s", path, exc)
    return decision, "measured"


def load_or_measure(model, cache_dir: Path | None, force: bool = False) -> Plan | None:
    """`model`'s decision: from the cache where this machine made it before, else measured now (and
    written to the cache). Sets `model.kernel_plan`; None where there is nothing to choose."""
    names = candidates(model)
    if names is None:
        return None
    if "ours" in names:  # the rule (module docstring): nothing to measure, nothing to cache
        return _set(model, Plan(one_row="ours", source="rule (our kernel builds here)"))
    def measure_now():
        plan = measure(model, names)
        return {"one_row": plan.one_row, "measured": plan.measured}

    decision, source = cached(cache_dir, "kernel-plans", key(model), measure_now,
                              valid=lambda d: d["one_row"] in names, force=force)
    return _set(model, Plan(one_row=decision["one_row"], source=source, measured=decision.get("measured")))


def _set(model, plan: Plan) -> Plan:
    model.kernel_plan = plan
    if plan.one_row == "ours":  # ours takes every row count the packed fp32 copies served: free them
        choose.drop_packed(model, torch.float32)
    return plan


@torch.inference_mode()
def measure(model, names: list[str], rounds: int = 5, steps: int = 2) -> Plan:
    """Time one-token decode steps through each of `names`, alternating; keep the fastest (see the
    module's docstring). Sets and returns `model.kernel_plan`."""
    cache = model.new_cache(32 + rounds * steps * len(names) + steps + 2)
    model.kernel_plan = Plan(one_row="gemv", source="measuring")
    model.forward(torch.arange(32, device=model.device) % model.vocab_size, cache)
    times = {p: [] for p in names}
    for r in range(rounds + 1):  # round 0 warms every path up and is dropped
        for path in names:
            model.kernel_plan = Plan(one_row=path, source="measuring")
            cache.crop(32)
            t0 = time.perf_counter()
            for _ in range(steps):
                model.forward(torch.tensor([7], device=model.device), cache)
            if r:
                times[path].append((time.perf_counter() - t0) / steps)
    ratio = statistics.median(a / b for a, b in zip(times["packed"], times["gemv"]))
    best = "packed" if ratio <= ONE_ROW_PACKED_IF else "gemv"
    if "ours" in times and statistics.median(a / b for a, b in zip(times["ours"], times[best])) < 1.0:
        best = "ours"  # only where a caller measures ours too (the load itself takes it by rule)
    ms = {f"{p}_ms": round(statistics.median(times[p]) * 1e3, 2) if p in times else None
          for p in ("packed", "gemv", "ours")}
    measured = {"threads": torch.get_num_threads(), **ms, "ratio": round(ratio, 3)}
    return _set(model, Plan(one_row=best, source="measured", measured=measured))


def summary(plan: Plan) -> str:
    """The decision in one line (load notes, bench bandwidth)."""
    m = plan.measured or {}
    if not m:
        return f"fp32 one-row matmuls: {NAMES[plan.one_row]} ({plan.source})"
    ours = f", {m['ours_ms']} ms ours" if m.get("ours_ms") is not None else ""
    return (f"fp32 one-row matmuls: {NAMES[plan.one_row]} (a step {m['packed_ms']} ms packed, "
            f"{m['gemv_ms']} ms GEMV{ours}, measured with {m['threads']} threads; {plan.source})")
