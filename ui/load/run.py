"""The Load tab's runs: N simulated clients through the real API on loopback, two runs side by side.

A pair of runs shares everything but its max batch. Both run the load generator (server/load/, as
`python -m server.bench load` does): its clients (server/load/clients.py `drive`, HTTP streams to
/v1/chat/completions, so the figures are the server's `timings`), its prompt pool and its judge
(server/load/pool.py: each reply must equal the same request alone, computed first, in-process).

Max batch per run: the engine keeps its own limit (`--max-batch`; the page starts with
`PAGE_MAX_BATCH`). Each run opens a batch scope with its own limit (engine Worker.open_batch_scope):
its clients are admitted at most that many at once, while other sessions' chats keep the engine's
limit (they still share the machine, and a batch, with the run). A remote backend batches as its
server does: its runs' max batch is unknown (None, shown as a dash).

A pair runs on a thread of the app; its clients in a process of their own, as in the bench
(server/load/clients.py: clients sharing the server's interpreter slow it down); the page
polls `LoadRunner.snapshot`.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass, field

from engine.core.errors import InvalidRequest
from engine.core.toggles import Toggle
from server.cli import DEFAULT_MAX_BATCH
from server.load.runs import DISTRIBUTIONS, ThinkTime, closed_pool, closed_run, collapse_sentence, plain_pool, \
    scope_limit, with_references

from ..shell.form import Form, choose
from .registry import LoadBusy, Runs  # noqa: F401 - LoadBusy re-exported (api.py)
from .report import LoadPoint, RunFigures, pair_sentence, reuse_html, throughput_series

PAGE_MAX_BATCH = DEFAULT_MAX_BATCH  # the servers' default --max-batch: the Load tab compares 1 and this
LOAD_POOL = "load_pool"  # the load bench's own two-turn conversations
MAX_CONVERSATIONS = 12  # distinct conversations (each needs its reference computed alone first)
LOAD_SETTINGS = (
    Toggle("clients", "int", 4, "Simulated clients",
           "concurrent clients; each plays its conversations one request after another", lo=1, hi=32,
           backends=("page",)),
    Toggle("requests_per_client", "int", 2, "Requests per client",
           "requests each client sends in a run (a two-turn conversation is 2)", lo=1, hi=16, backends=("page",)),
    Toggle("max_new_tokens", "int", 16, "Max tokens", "output tokens per request, at most (greedy)",
           lo=1, hi=256, backends=("page",)),
    Toggle("max_batch_1", "int", 1, "Run 1: max batch",
           "at most this many of the run's requests decode together (a limit of this run only)", lo=1,
           hi=256, backends=("page",)),
    Toggle("max_batch_2", "int", PAGE_MAX_BATCH, "Run 2: max batch",
           "at most this many of the run's requests decode together (a limit of this run only)", lo=1,
           hi=256, backends=("page",)),
    # KV reuse under load (server/load/reuse.py): longer conversations, a pause between turns, the cache's budget
    Toggle("turns", "int", 2, "Turns per conversation",
           "each follow-up turn extends its conversation's history (the load bench's pool; a page set keeps its own "
           "turns)", lo=1, hi=8, backends=("page",)),
    Toggle("think_time_s", "float", 0.0, "Think time (mean s)",
           "a client's pause between a reply and its conversation's next turn, drawn per turn around this mean",
           lo=0.0, hi=60.0, step=0.5, backends=("page",)),
    Toggle("think_dist", "choice", "exponential", "Think time distribution",
           "constant: the mean; exponential: most short, a few long; uniform: 0 to twice the mean; lognormal: a long "
           "right tail, as people's pauses", choices=DISTRIBUTIONS, backends=("page",)),
    Toggle("kv_budget_mb_1", "float", 0.0, "Run 1: KV budget (MiB)",
           "the prefix cache's budget during run 1 (0: the engine's own)", lo=0.0, hi=65536.0,
           backends=("page",)),
    Toggle("kv_budget_mb_2", "float", 0.0, "Run 2: KV budget (MiB)",
           "the prefix cache's budget during run 2 (0: the engine's own)", lo=0.0, hi=65536.0,
           backends=("page",)),
)
LOAD_FORM = Form(LOAD_SETTINGS, ("prompt_set", "backend"))
LOAD_FIELDS = LOAD_FORM.fields


@dataclass(frozen=True)
class LoadSpec:
    """What a pair of runs does, checked: everything but `max_batches` is shared by both runs."""

    clients: int
    requests_per_client: int
    max_new_tokens: int
    max_batches: tuple[int | None, int | None]  # None: the backend's own batching (a remote server)
    prompt_set: str
    backend: str
    turns: int = 2
    think: ThinkTime | None = None  # None: no pause between turns
    kv_budgets: tuple[float | None, float | None] = (None, None)  # MiB per run; None: the engine's own

    @property
    def reuse_study(self) -> bool:
        """Longer chats, pauses or a budget: every conversation greedy with KV reuse in a session."""
        return self.turns > 2 or self.think is not None or any(b is not None for b in self.kv_budgets)

    @property
    def requests(self) -> int:
        return self.clients * self.requests_per_client


def parse_spec(values: dict, prompt_sets: dict, engines: dict) -> LoadSpec:
    """The tab's values (as the page sends them) → a LoadSpec, or InvalidRequest naming the field."""
    got = LOAD_FORM.read(values)
    prompt_set = choose(got["prompt_set"], prompt_set_choices(prompt_sets), "prompt_set")
    backend = choose(got["backend"], list(engines), "backend")
    limit = scope_limit(engines[backend])
    batches = (got["max_batch_1"], got["max_batch_2"])
    if limit is None:
        batches = (None, None)
    elif any(b > limit for b in batches):
        raise InvalidRequest(f"max batch must be 1 to {limit} on this engine: it was started with --max-batch "
                             f"{limit} (restart it with a larger --max-batch to compare more)", "max_batch_2")
    think = ThinkTime(got["think_time_s"], got["think_dist"]) if got["think_time_s"] > 0 else None
    budgets = tuple(b if b > 0 else None for b in (got["kv_budget_mb_1"], got["kv_budget_mb_2"]))
    return LoadSpec(got["clients"], got["requests_per_client"], got["max_new_tokens"], batches, prompt_set, backend,
                    got["turns"], think, budgets)


def prompt_set_choices(prompt_sets: dict) -> list[str]:
    """The load bench's pool, then the page's sets of plain turns (a set with a seeded history is
    left out: every request would prefill ~1,000 tokens of it)."""
    return [LOAD_POOL] + [k for k, s in prompt_sets.items() if not any(i.get("history") for i in s["items"])]


def build_conversations(spec: LoadSpec, prompt_sets: dict) -> list:
    """The pool of conversations the clients cycle through (no speculation, no other weights: those run
    beside the batch, and would measure something else than the batch limit)."""
    n = max(1, min(MAX_CONVERSATIONS, math.ceil(spec.requests / spec.turns)))
    if spec.prompt_set == LOAD_POOL:
        return closed_pool(n, spec.max_new_tokens, spec.turns, spec.reuse_study)
    return plain_pool([item["turns"] for item in prompt_sets[spec.prompt_set]["items"][:n]], spec.max_new_tokens)


@dataclass
class RunState:
    """One run of a pair, as it goes: its points (one per finished request) and, at the end, its figures."""

    label: str
    max_batch: int | None
    kv_budget_mb: float | None = None
    status: str = "waiting"  # waiting | running | done | stopped | error
    started: float | None = None
    wall_s: float | None = None
    points: list[LoadPoint] = field(default_factory=list)
    figures: RunFigures | None = None
    reuse: dict | None = None  # KV reuse figures (server/load/reuse.py), when the run is over

    def elapsed(self) -> float:
        if self.wall_s is not None:
            return self.wall_s
        return time.perf_counter() - self.started if self.started else 0.0

    def to_dict(self) -> dict:
        return {"label": self.label, "max_batch": self.max_batch, "status": self.status,
                "elapsed_s": round(self.elapsed(), 2), "points": [p.to_dict() for p in self.points],
                "throughput": [s.to_dict() for s in throughput_series(self.points, self.elapsed())],
                "figures": self.figures.to_dict() if self.figures else None, "reuse": self.reuse}


@dataclass
class LoadPair:
    id: str
    spec: LoadSpec
    runs: list[RunState]
    status: str = "references"  # references | running | done | stopped | error
    message: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def to_dict(self) -> dict:
        figures = [r.figures for r in self.runs]
        done = self.status in ("done", "stopped") and all(figures)
        return {"id": self.id, "status": self.status, "message": self.message,
                "spec": {"clients": self.spec.clients, "requests_per_client": self.spec.requests_per_client,
                         "max_new_tokens": self.spec.max_new_tokens, "prompt_set": self.spec.prompt_set,
                         "backend": self.spec.backend},
                "runs": [r.to_dict() for r in self.runs],
                "sentence": pair_sentence(self.spec.clients, *self.runs) if done else None,
                **self.reuse_parts(done)}

    def reuse_parts(self, done: bool) -> dict:
        """The KV reuse table and the sentence naming where reuse collapses, once both runs are over."""
        rows = [dict(r.reuse, run=r.label) for r in self.runs if r.reuse]
        if not done or not rows or not any(r.get("follow_ups") for r in rows):
            return {"reuse_html": None, "reuse_sentence": None}
        return {"reuse_html": reuse_html(rows), "reuse_sentence": collapse_sentence(rows)}


class LoadRunner:
    """Pairs of load runs, one at a time on this app (they would measure each other otherwise)."""

    def __init__(self, engines: dict, prompt_sets: dict, runs: Runs | None = None):
        self.engines = engines
        self.prompt_sets = prompt_sets
        self.runs = runs or Runs()  # every load run of this app, open-loop sweeps too (one at a time)
        self._references: dict[tuple, list] = {}  # (backend, prompt set, tokens, conversations) -> pool

    def start(self, values: dict, url: str, headers: dict | None = None) -> LoadPair:
        spec = parse_spec(values, self.prompt_sets, self.engines)
        label = "max batch {}" if spec.max_batches[0] is not None else "run {}"
        runs = [RunState(label.format(b if b is not None else i + 1)
                         + (f" · KV {kv:g} MiB" if kv is not None else ""), b, kv)
                for i, (b, kv) in enumerate(zip(spec.max_batches, spec.kv_budgets))]
        pair = LoadPair(secrets.token_urlsafe(12), spec, runs)
        return self.runs.start(pair, lambda p: self._run(p, url, headers or {}), "load-run", "the load run")

    def get(self, pair_id: str) -> LoadPair:
        return self.runs.get(pair_id, LoadPair, "no such load run (the server keeps the latest few)")

    # --- the run thread ----------------------------------------------------------------------
    def _run(self, pair: LoadPair, url: str, headers: dict) -> None:
        pool = self._pool(pair)
        pair.status = "running"
        for run in pair.runs:
            if pair.stop.is_set():
                break
            pair.message = f"{run.label}: {pair.spec.clients} clients, {pair.spec.requests} requests…"
            self._one_run(pair, run, pool, url, headers)

    def _pool(self, pair: LoadPair) -> list:
        spec = pair.spec
        pool = build_conversations(spec, self.prompt_sets)
        key = (spec.backend, spec.prompt_set, spec.max_new_tokens, len(pool), spec.turns, spec.reuse_study)
        if key not in self._references:
            def progress(done, total):
                pair.message = f"references: each request alone first, for the judge ({done} of {total})"

            self._references[key] = with_references(self.engines[spec.backend], pool, progress)
        return self._references[key]

    def _one_run(self, pair: LoadPair, run: RunState, pool: list, url: str, headers: dict) -> None:
        run.status, run.started = "running", time.perf_counter()
        reuse: dict = {}
        try:
            results, run.wall_s = closed_run(
                self.engines[pair.spec.backend], url, pool, backend=pair.spec.backend, clients=pair.spec.clients,
                requests=pair.spec.requests, max_batch=run.max_batch, headers=headers, stop=pair.stop,
                think=pair.spec.think, kv_budget_mb=run.kv_budget_mb, reuse=reuse,
                # Stop kills the clients: their streams close, the server cancels them
                on_result=lambda r: run.points.append(LoadPoint.of(r, time.perf_counter() - run.started)))
        except Exception:  # the run ends here; its clock stops with it
            run.wall_s = time.perf_counter() - run.started
            raise
        run.figures = RunFigures.of(pair.spec.clients, results, run.wall_s)
        run.reuse = reuse
        run.status = "stopped" if pair.stop.is_set() else "done"
