"""Load runs against a server while it serves other users: the page's one door into the load generator
(ui/load/ imports this module of server/load and no other).

`python -m server.bench load` serves engines of its own (scenario.py, open_scenario.py); a run here
shares the server's one engine with everyone's chats instead, so each run gets a *batch scope* of its
own (engine Worker.open_batch_scope: at most `max_batch` of the run's requests decode together, other
sessions keep the engine's limit) and the worker goes idle before the next run starts. Both kinds run the
same clients (clients.py, in a process of their own), the same judge (pool.py) and the same figures.

- `scope_limit`: the largest max batch a backend takes (None: it batches as its own server does).
- `closed_pool`, `plain_pool`, `with_references`: the conversations, then each request's reference (alone).
- `closed_run`: N clients through the API under a batch scope (`think`, `kv_budget_mb`: reuse.py's knobs).
- `open_turns`, `open_sweeps`: the open loop's turns and probe, then a rate sweep per max batch.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

from .clients import drive_elsewhere
from .drive import wait_idle
from .figures import BAD, COMPLETE, JUDGED, level_row, prefill_clause
from .open_scenario import PROBE_PROMPT, probe_turn, references
from .pareto import points as pareto_points
from .pareto import sentence as pareto_sentence
from .pool import Result, ScriptedConversation, Turn, build_pool, compute_references
from .reuse import DISTRIBUTIONS, ThinkTime, cache_counts, cache_figures, collapse_sentence, counts_diff, kv_budget, \
    reuse_figures
from .serve_figures import DEFAULT_OBJECTIVES
from .sweep import Sweep, SweepSettings

# The page's whole vocabulary of the load generator: these functions, and what it reads of the judge
# (BAD, COMPLETE, JUDGED), the figures (level_row, prefill_clause), the Pareto view and the sweep.
__all__ = ["BAD", "COMPLETE", "DEFAULT_OBJECTIVES", "DISTRIBUTIONS", "JUDGED", "PROBE_PROMPT", "REQUEST_DEADLINE_S", "Result",
           "Sweep", "SweepSettings", "ThinkTime", "closed_pool", "collapse_sentence", "closed_run", "level_row", "open_sweeps",
           "open_turns", "pareto_points", "pareto_sentence", "plain_pool", "prefill_clause", "scope_limit", "with_references"]

REQUEST_DEADLINE_S = 300.0  # a request past this is "stuck" (the bench's default)
PLAIN_TOGGLES = {"speculative": None, "quantization": None}  # those requests would run beside the batch


def scope_limit(engine) -> int | None:
    """The largest run max batch a backend takes (its --max-batch), None when it has no batch scopes."""
    if not hasattr(engine, "open_batch_scope"):
        return None
    return ((engine.info().batching or {}).get("max_batch")) or 1


def scoped(turns: list[Turn], backend: str, scope: str | None) -> list[Turn]:
    """Each request naming the backend (the API's model) and the run's batch scope; references kept."""
    extra = {"model": backend, **({"batch_scope": scope} if scope is not None else {})}
    return [replace(t, body={**t.body, **extra}) for t in turns]


@contextlib.contextmanager
def batch_scope(engine, max_batch: int | None):
    """A batch scope of `max_batch` on the engine for the block (None: the backend batches as it does);
    on the way out the worker goes idle (cancelled requests leave) before the scope closes."""
    scope = engine.open_batch_scope(max_batch) if max_batch is not None else None
    try:
        yield scope
    finally:
        wait_idle(engine)
        if scope is not None:
            engine.close_batch_scope(scope)


def closed_pool(conversations: int, max_new_tokens: int, turns: int = 2,
                reuse_only: bool = False) -> list[ScriptedConversation]:
    """The load bench's conversations of `turns` turns, greedy, with no speculation or other weights
    (`reuse_only`: every one with KV reuse in a session, reuse.py's study)."""
    return build_pool(conversations, max_new_tokens, PLAIN_TOGGLES, turns, reuse_only)


def plain_pool(turn_lists: list[list[str]], max_new_tokens: int) -> list[ScriptedConversation]:
    """Conversations of plain user turns, greedy, with KV reuse in a session each."""
    body = {"max_tokens": max_new_tokens, "temperature": 0.0, "kv_reuse": True}
    return [ScriptedConversation(i, with_session=True, turns=[
        Turn(f"c{i}t{j + 1}", {**body, "messages": [{"role": "user", "content": text}]})
        for j, text in enumerate(turns)]) for i, turns in enumerate(turn_lists)]


def with_references(engine, pool: list[ScriptedConversation], progress=None) -> list[ScriptedConversation]:
    """The pool with each request's reference computed (alone, in order: what the judge compares with);
    `progress(done, total)` first at 0, then after each request."""
    if progress is not None:
        progress(0, sum(len(c.turns) for c in pool))
    compute_references(engine, pool, progress=progress)
    return pool


def closed_run(engine, url: str, pool: list[ScriptedConversation], *, backend: str, clients: int, requests: int,
               max_batch: int | None, headers: dict | None = None, on_result=None, stop=None,
               think: ThinkTime | None = None, kv_budget_mb: float | None = None,
               reuse: dict | None = None) -> tuple[list[Result], float]:
    """`clients` clients play the pool's conversations through the API at `url` until `requests` are done, under
    a batch scope of `max_batch`; returns the judged results and the run's wall time (seconds, the
    clients' process start to its end). `stop`: set it to end the run (its streams close, the server
    cancels them). `reuse`: filled with the run's KV reuse figures (reuse.py: the prefix cache's hit rate,
    evictions and budget over the run, follow-up turns' TTFT against first turns')."""
    before = cache_counts(engine)
    with kv_budget(engine, kv_budget_mb), batch_scope(engine, max_batch) as scope:
        budget = getattr(getattr(engine, "prefix_cache", None), "budget_bytes", None)
        runs = [replace(c, turns=scoped(c.turns, backend, scope)) for c in pool]
        t0 = time.perf_counter()
        try:
            results, _ = drive_elsewhere(url, runs, clients, REQUEST_DEADLINE_S * 4, requests, 0, REQUEST_DEADLINE_S,
                                         headers=headers, on_result=on_result, stop=stop, think=think)
        finally:
            wall = time.perf_counter() - t0
    if reuse is not None:
        reuse.update(clients=clients, **cache_figures(counts_diff(before, cache_counts(engine)), None, budget),
                     **reuse_figures(results, pool))
    return results, wall


def open_turns(engine, conversations: int, max_new_tokens: int, probe_prompt: str | None, backend: str
               ) -> tuple[list[Turn], Turn | None]:
    """The open loop's turns (the load bench's pool, flat) and its probe, each with its reference."""
    pool = build_pool(conversations, max_new_tokens, PLAIN_TOGGLES)
    probe = probe_turn(probe_prompt, max_new_tokens) if probe_prompt else None
    return references(engine, pool, probe, lambda line: None, backend), probe


def open_sweeps(engine, url: str, turns: list[Turn], probe: Turn | None, settings: SweepSettings, max_batches,
                *, backend: str, headers: dict | None = None, stop=None, on_sweep=None, out=None) -> dict:
    """A rate sweep per max batch, one after the other, each under a batch scope of its own; returns
    {max batch: the sweep's result}. `on_sweep(sweep)`: each sweep as it starts (its rows grow live);
    `out(line)`: its progress lines."""
    results = {}
    for mb in max_batches:
        if stop is not None and stop.is_set():
            break
        with batch_scope(engine, mb) as scope:
            sprobe = scoped([probe], backend, scope)[0] if probe is not None else None
            sweep = Sweep(settings, url, scoped(turns, backend, scope), probe=sprobe, max_batch=mb, headers=headers,
                          after_level=lambda _: wait_idle(engine), stop=stop, out=out or (lambda line: None))
            if on_sweep is not None:
                on_sweep(sweep)
            results[mb] = sweep.run()
    return results
