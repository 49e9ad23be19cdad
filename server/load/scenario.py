"""The load against engines we serve ourselves: `run_one` (one engine) and `run_side_by_side` (one
engine per max batch over one loaded model, the levels alternating between them). Each serves its
engine through our API on a free 127.0.0.1 port in this process, probes what the engine offers,
builds the pool, computes the references, then runs the load (drive.run_load). Progress lines go to
`out`; the figures come back as dicts (`python -m server.bench load` prints them)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from .drive import MemorySampler, run_load
from .figures import failures, merge_rows
from .pool import build_pool, compute_references, offered_toggles
from .reuse import ThinkTime


@dataclass(frozen=True)
class LoadSettings:
    """A load's settings (`python -m server.bench load`'s flags of the same names)."""

    duration: float  # seconds each level keeps sending
    max_requests: int  # at most this many requests per level
    max_new_tokens: int
    conversations: int  # two-turn conversations in the pool
    cancel_every: int  # every Nth request disconnects (0: none)
    deadline: float  # seconds a request may take before it is stuck
    repeat: int  # run the whole load this many times
    max_queue: int | None  # the worker's queue bound (None: none)
    kv_cache_mb: float | str  # MiB or "auto" (engine/serving/kv_budget.py)
    shared_prefix_cache: bool
    mix_quantization: str = "auto"  # auto, a variant name, or none
    mix_speculative: str = "auto"  # auto or none
    turns: int = 2  # turns per conversation
    reuse_only: bool = False  # every conversation greedy with KV reuse in a session (reuse.py)
    think: ThinkTime | None = None  # the clients' pause between turns
    kv_budgets: tuple[float, ...] = ()  # run every level once per prefix-cache budget (MiB); (): the engine's own


def _engine(loaded, s: LoadSettings, max_batch: int):
    from engine.serving import kv_budget
    from engine.serving.service import Engine

    return Engine(loaded, max_queue=s.max_queue, max_batch=max_batch,
                  prefix_cache=kv_budget.prefix_cache(s.kv_cache_mb, loaded.device, shared=s.shared_prefix_cache))


def _pool(engine, s: LoadSettings) -> tuple[list, dict]:
    offers = offered_toggles(engine, variants=s.mix_quantization)
    if s.mix_speculative == "none":
        offers["speculative"] = None
    return build_pool(s.conversations, s.max_new_tokens, offers, s.turns, s.reuse_only), offers


def run_one(loaded, s: LoadSettings, levels, max_batch: int, out) -> dict:
    """The whole load against one engine (max batch `max_batch`) over the loaded model."""
    from server.api import create_api
    from server.run import BackgroundServer

    engine = _engine(loaded, s, max_batch)
    try:
        with MemorySampler(engine.prefix_cache) as sampler, BackgroundServer(create_api(engine)) as url:
            pool, offers = _pool(engine, s)
            sampler.phase = "references"
            t0 = time.perf_counter()
            compute_references(engine, pool)
            refs = [t.ref_text for c in pool for t in c.turns]
            out(f"{engine.info().name} ({engine.info().dtype}) on {url}: {len(pool)} conversations, "
                f"references in {time.perf_counter() - t0:.1f} s ({len(set(refs))} distinct of {len(refs)}); "
                f"offered: {offers}")
            parts = []
            for mb in s.kv_budgets or (None,):  # one load per KV budget, the same engine and pool
                if mb is not None:
                    out(f"KV budget {mb:g} MiB:")
                parts.append(run_load(engine, url, pool, levels, duration=s.duration, max_requests=s.max_requests,
                                      cancel_every=s.cancel_every, deadline=s.deadline, repeat=s.repeat,
                                      sampler=sampler, out=out, think=s.think, kv_budget_mb=mb))
            result = merge_loads(parts)
    finally:
        engine.close()
    bad = failures(result["totals"], result["stuck_workers"], result["server_5xx"], s.max_queue is not None)
    return {**result, "offers": offers, "levels": levels, "dtype": engine.info().dtype, "max_batch": max_batch,
            "batching": engine.info().batching, "reference_texts": refs,
            "distinct_references": len(set(refs)), "references": len(refs),
            "ok": bad == 0 and result["kv_within_budget"] and result["memory_ok"],
            "ratio": None}


def merge_loads(parts: list[dict]) -> dict:
    """Loads of the same levels at several KV budgets as one: every budget's rows (each names its
    `kv_budget_mb`), counts added, every check kept; memory run over run is the first load's."""
    if len(parts) == 1:
        return parts[0]
    merged = {**parts[0], "rows": [row for p in parts for row in p["rows"]]}
    merged["totals"] = {k: sum(p["totals"][k] for p in parts) for k in parts[0]["totals"]}
    for k in ("stuck_workers", "server_5xx"):
        merged[k] = sum(p[k] for p in parts)
    for k in ("memory_ok", "kv_within_budget"):
        merged[k] = all(p[k] for p in parts)
    merged["kv_bytes_max"] = max(p["kv_bytes_max"] for p in parts)
    merged["kv_budget_bytes"] = max((p["kv_budget_bytes"] or 0) for p in parts) or None
    return merged


def run_side_by_side(loaded, s: LoadSettings, levels, batches, out) -> dict:
    """One engine + API per max batch over `loaded`; each level runs on every engine in turn (this
    machine is shared and noisy: a comparison of runs minutes apart would measure the neighbours)."""
    from server.api import create_api
    from server.run import BackgroundServer

    with contextlib.ExitStack() as stack:
        setups = {}
        for mb in batches:
            engine = _engine(loaded, s, mb)
            stack.callback(engine.close)
            sampler = stack.enter_context(MemorySampler(engine.prefix_cache))
            url = stack.enter_context(BackgroundServer(create_api(engine)))
            pool, offers = _pool(engine, s)
            t0 = time.perf_counter()
            compute_references(engine, pool)
            refs = [t.ref_text for c in pool for t in c.turns]
            out(f"max batch {mb}: references in {time.perf_counter() - t0:.1f} s "
                f"({len(set(refs))} distinct of {len(refs)}); offered: {offers}")
            setups[mb] = (engine, url, pool, sampler, refs, offers)
        parts = {mb: [] for mb in batches}
        for _ in range(s.repeat):
            for n in levels:
                for mb in batches:
                    engine, url, pool, sampler, _, _ = setups[mb]
                    parts[mb].append(run_load(engine, url, pool, (n,), duration=s.duration,
                                              max_requests=s.max_requests, cancel_every=s.cancel_every,
                                              deadline=s.deadline, repeat=1, sampler=sampler, think=s.think,
                                              out=lambda line, mb=mb: out(f"max batch {mb}, {line}")))
        by_batch = {}
        for mb in batches:
            engine, _, _, _, refs, offers = setups[mb]
            runs = parts[mb]
            rows = [merge_rows([r["rows"][0] for r in runs if r["rows"][0]["clients"] == n]) for n in levels]
            totals = {k: sum(r["totals"][k] for r in runs) for k in runs[0]["totals"]}
            stuck, s5xx = sum(r["stuck_workers"] for r in runs), sum(r["server_5xx"] for r in runs)
            kv_ok = all(r["kv_within_budget"] for r in runs)
            by_batch[mb] = {"rows": rows, "totals": totals, "stuck_workers": stuck, "server_5xx": s5xx,
                            "kv_within_budget": kv_ok, "max_batch": mb, "batching": engine.info().batching,
                            "offers": offers, "reference_texts": refs,
                            "ok": failures(totals, stuck, s5xx, s.max_queue is not None) == 0 and kv_ok}
    return by_batch
