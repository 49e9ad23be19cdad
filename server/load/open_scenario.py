"""Open-loop loads from the command line (`python -m server.bench load --request-rate ...`): one
schedule or a sweep per max batch against engines we serve ourselves (each behind our API on
loopback, as scenario.py does for closed loop), or against a remote OpenAI-compatible server
(`--base-url`), measured from the client side with the same judge: each reply against the same
request alone, sent first, one at a time."""

from __future__ import annotations

import contextlib
import time

from . import pareto
from .drive import wait_idle
from .open_loop import PROBE
from .pool import Turn, build_pool, compute_references
from .sweep import Sweep, SweepSettings

PROBE_PROMPT = "Explain how a refrigerator keeps food cold."
EXTENSIONS = ("kv_reuse",)  # our API's fields a plain OpenAI-compatible server would not know


def turns_of(pool) -> list[Turn]:
    return [t for c in pool for t in c.turns]


def probe_turn(prompt: str, max_new_tokens: int) -> Turn:
    return Turn(PROBE, {"max_tokens": max_new_tokens, "temperature": 0.0,
                        "messages": [{"role": "user", "content": prompt}]})


def plain(turns: list[Turn], model: str) -> list[Turn]:
    """Turns a remote server takes: our extension fields dropped, the server's model named."""
    return [Turn(t.key, {**{k: v for k, v in t.body.items() if k not in EXTENSIONS}, "model": model})
            for t in turns]


def references(engine, pool, probe: Turn | None, out, label: str) -> list[Turn]:
    """Each turn's reference, alone and in order (a second turn's history is its first turn's reference),
    and the probe's; the flat list of turns the open-loop clients cycle through."""
    t0 = time.perf_counter()
    compute_references(engine, pool)
    if probe is not None:
        from .pool import ScriptedConversation

        compute_references(engine, [ScriptedConversation(-1, False, [probe])])
    out(f"{label}: references (each request alone) in {time.perf_counter() - t0:.1f} s")
    return turns_of(pool)


def run_local(loaded, s: SweepSettings, batches, *, conversations: int, max_new_tokens: int, probe_prompt: str | None,
              max_queue: int | None, kv_cache_mb: float, shared_prefix_cache: bool, out) -> dict:
    """A sweep per max batch, one after the other, each against its own engine and API on loopback."""
    from server.api import create_api
    from server.run import BackgroundServer

    from .scenario import LoadSettings, _engine

    ls = LoadSettings(0, 0, max_new_tokens, conversations, 0, s.deadline, 1, max_queue, kv_cache_mb,
                      shared_prefix_cache)
    by_batch = {}
    for mb in batches:
        with contextlib.ExitStack() as stack:
            engine = _engine(loaded, ls, mb)
            stack.callback(engine.close)
            url = stack.enter_context(BackgroundServer(create_api(engine)))
            pool = build_pool(conversations, max_new_tokens, {"speculative": None, "quantization": None})
            probe = probe_turn(probe_prompt, max_new_tokens) if probe_prompt else None
            turns = references(engine, pool, probe, out, f"max batch {mb}")
            t0 = time.perf_counter()
            sweep = Sweep(s, url, turns, probe=probe, max_batch=mb, after_level=lambda _, e=engine: wait_idle(e),
                          out=lambda line: out(f"  {line}"))
            result = sweep.run()
            result["sweep_s"] = round(time.perf_counter() - t0, 1)
            result["dtype"] = engine.info().dtype
            by_batch[mb] = result
            out(summary_line(result))
    return finish(by_batch, out)


def run_remote(s: SweepSettings, base_url: str, model: str, api_key: str | None, *, conversations: int,
               max_new_tokens: int, probe_prompt: str | None, out) -> dict:
    """The sweep against a remote OpenAI-compatible server, from this client: its batching is its own
    (max batch unknown, None)."""
    from engine.remote.client import RemoteEngine

    remote = RemoteEngine(base_url, model, api_key=api_key)
    try:
        pool = build_pool(conversations, max_new_tokens, {"speculative": None, "quantization": None})
        for c in pool:
            c.turns = plain(c.turns, model)
        probe = plain([probe_turn(probe_prompt, max_new_tokens)], model)[0] if probe_prompt else None
        turns = references(remote, pool, probe, out, f"{model} at {base_url}")
    finally:
        remote.close()
    root = base_url.rstrip("/").removesuffix("/v1")  # the clients add /v1/chat/completions
    t0 = time.perf_counter()
    result = Sweep(s, root, turns, probe=probe, api_key=api_key, out=lambda line: out(f"  {line}")).run()
    result["sweep_s"] = round(time.perf_counter() - t0, 1)
    result.update(base_url=base_url, model=model)
    out(summary_line(result))
    return finish({None: result}, out)


def summary_line(r: dict) -> str:
    knee = r["knee_request_rate"]
    where = "" if r["knee_reached"] is not False else " or above (no level saturated: a lower bound)"
    return (f"{'max batch ' + str(r['max_batch']) if r['max_batch'] else 'remote'}: knee at "
            f"{knee if knee is not None else 'unknown'} req/s offered{where}, best goodput "
            f"{r['max_request_goodput']} req/s; "
            f"{len(r['levels'])} levels in {r['sweep_s']} s (stopped: {r['stopped_because']})")


def finish(by_batch: dict, out) -> dict:
    """The sweeps, the Pareto points and sentence, and the ratio of goodputs (largest / smallest max batch)."""
    sentence = pareto.sentence({k: v for k, v in by_batch.items() if k is not None})
    if sentence:
        out(sentence)
    keys = [k for k in by_batch if k is not None]
    ratio = None
    if len(keys) >= 2:
        ga, gb = by_batch[min(keys)]["max_request_goodput"], by_batch[max(keys)]["max_request_goodput"]
        ratio = round(gb / ga, 3) if ga and gb is not None else None
    return {"sweeps": {str(k) if k is not None else "remote": v for k, v in by_batch.items()},
            "pareto": {str(k) if k is not None else "remote": pareto.points(v) for k, v in by_batch.items()},
            "trade_off": sentence, "goodput_ratio": ratio, "ratio": ratio,
            "ok": all(v["ok"] for v in by_batch.values())}
