"""The Load tab's open-loop sweep: requests arrive at a rate (Poisson, bursty or constant) whether or
not the earlier ones have finished, the rate rising level by level up to saturation, once per max
batch; the figures per level, the knee, the Pareto trade-off and the probe's stages per level.

The sweep itself is server/load/sweep.py (`python -m server.bench load --request-rate sweep` runs
the same one); this module declares the tab's settings once (OPEN_SETTINGS), runs the sweeps on a
thread against this server's own API on loopback, each max batch under a batch scope of its own
(as run.py's closed-loop runs), and keeps a snapshot the page polls. A remote backend batches as
its server does: one sweep, max batch unknown (None).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from engine.core.errors import InvalidRequest
from engine.core.toggles import Toggle
from server.load.runs import (
    DEFAULT_OBJECTIVES,
    PROBE_PROMPT,
    REQUEST_DEADLINE_S,
    Sweep,
    SweepSettings,
    open_sweeps,
    open_turns,
    pareto_points,
    pareto_sentence,
    scope_limit,
)

from ..shell.form import Form, choose

MAX_PROMPT_CHARS = 2000
OPEN_SETTINGS = (
    Toggle("arrivals", "choice", "poisson", "Arrivals",
           "poisson: random gaps (gamma with the burstiness as its shape, as vLLM's bench serve); constant: "
           "exactly 1/rate apart", choices=("poisson", "constant"), backends=("page",)),
    Toggle("burstiness", "float", 1.0, "Burstiness", "1: Poisson; below 1 burstier, above 1 more regular",
           lo=0.1, hi=10.0, backends=("page",)),
    Toggle("num_prompts", "int", 8, "Requests per level", "requests sent at each rate", lo=2, hi=200,
           backends=("page",)),
    Toggle("max_new_tokens", "int", 16, "Max tokens", "output tokens per request, at most (greedy)",
           lo=1, hi=256, backends=("page",)),
    Toggle("start_rate", "float", 0.0, "First rate (req/s)",
           "0: half of what one request at a time serves (measured: each request alone, first)", lo=0.0,
           hi=1000.0, backends=("page",)),
    Toggle("factor", "float", SweepSettings.factor, "Rate step (×)", "each level offers this many times the last one's rate",
           lo=1.05, hi=8.0, backends=("page",)),
    Toggle("max_levels", "int", 6, "Most levels", "the sweep stops here if it has not saturated",
           lo=1, hi=12, backends=("page",)),
    Toggle("ttft_ms", "float", DEFAULT_OBJECTIVES["ttft"], "Objective: TTFT (ms)",
           "a request counts toward goodput only within it; the sweep stops when p90 TTFT passes it tenfold",
           lo=1.0, hi=600000.0, backends=("page",)),
    Toggle("tpot_ms", "float", DEFAULT_OBJECTIVES["tpot"], "Objective: TPOT (ms)",
           "0: none; default: the reading pace (a reply streams as fast as it is read)", lo=0.0, hi=600000.0, backends=("page",)),
    Toggle("e2el_ms", "float", 0.0, "Objective: E2E (ms)", "0: none", lo=0.0, hi=600000.0, backends=("page",)),
    Toggle("seed", "int", 0, "Seed", "the arrival schedule's seed: the same seed, the same gaps", lo=0,
           hi=2**31 - 1, backends=("page",)),
)
OPEN_FORM = Form(OPEN_SETTINGS, ("max_batches", "probe", "backend"))
OPEN_FIELDS = OPEN_FORM.fields


@dataclass(frozen=True)
class OpenSpec:
    sweep: SweepSettings
    max_new_tokens: int
    max_batches: tuple  # (None,): the backend's own batching (a remote server)
    probe: str
    backend: str


def batch_choices(limit: int | None) -> list[int]:
    """The max batches the tab offers: 1, 2, 4, ... up to the engine's limit (and the limit itself)."""
    if limit is None:
        return []
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


def parse_open(values: dict, engines: dict) -> OpenSpec:
    got = OPEN_FORM.read(values)
    backend = choose(got["backend"], list(engines), "backend")
    limit = scope_limit(engines[backend])
    if limit is None:
        batches = (None,)
    else:
        raw = got["max_batches"] or [1]
        try:
            batches = tuple(sorted({int(b) for b in raw}))
        except (TypeError, ValueError):
            raise InvalidRequest("max_batches must be a list of whole numbers", "max_batches") from None
        if any(b < 1 or b > limit for b in batches):
            raise InvalidRequest(f"max batch must be 1 to {limit} on this engine: it was started with --max-batch "
                                 f"{limit}", "max_batches")
    probe = str(got["probe"] or "").strip()
    if len(probe) > MAX_PROMPT_CHARS:
        raise InvalidRequest(f"the probe prompt must be at most {MAX_PROMPT_CHARS} characters", "probe")
    objectives = {k: got[f"{k}_ms"] for k in ("ttft", "tpot", "e2el") if got[f"{k}_ms"]}
    s = SweepSettings(start_rate=got["start_rate"] or None, factor=got["factor"], max_levels=got["max_levels"],
                      num_prompts=got["num_prompts"], burstiness=got["burstiness"], process=got["arrivals"],
                      seed=got["seed"], objectives=objectives, deadline=REQUEST_DEADLINE_S)
    return OpenSpec(s, got["max_new_tokens"], batches, probe, backend)


@dataclass
class OpenRun:
    id: str
    spec: OpenSpec
    status: str = "references"  # references | running | done | stopped | error
    message: str = ""
    sweeps: list = field(default_factory=list)  # Sweep objects, one per max batch as they start
    results: dict = field(default_factory=dict)  # max batch -> Sweep.result()
    started: float = field(default_factory=time.perf_counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def to_dict(self) -> dict:
        s = self.spec.sweep
        out = {"id": self.id, "status": self.status, "message": self.message,
               "elapsed_s": round(time.perf_counter() - self.started, 1),
               "spec": {"max_batches": list(self.spec.max_batches), "objectives": dict(s.objectives),
                        "num_prompts": s.num_prompts, "arrivals": s.process, "burstiness": s.burstiness,
                        "max_new_tokens": self.spec.max_new_tokens, "probe": self.spec.probe,
                        "backend": self.spec.backend},
               "sweeps": [self._sweep_dict(sw) for sw in self.sweeps]}
        done = self.status in ("done", "stopped")
        out["sentence"] = pareto_sentence({k: v for k, v in self.results.items() if k is not None}) if done else None
        return out

    def _sweep_dict(self, sw: Sweep) -> dict:
        r = sw.result()
        return {**r, "running_rate": sw.rate, "points": list(sw.points),
                "pareto": pareto_points(r), "label": f"max batch {sw.max_batch}" if sw.max_batch else "the server's"}


class OpenLoopRunner:
    """Open-loop sweeps, in the closed-loop runner's table of runs (ui/load/registry.py): one load run
    at a time on this app, of either kind."""

    def __init__(self, closed):
        self.engines = closed.engines
        self.runs = closed.runs  # one table and one-at-a-time rule for both kinds of load run
        self._references: dict[tuple, tuple] = {}  # (backend, tokens, probe) -> (turns, probe turn)

    def start(self, values: dict, url: str, headers: dict | None = None) -> OpenRun:
        run = OpenRun(secrets.token_urlsafe(12), parse_open(values, self.engines))
        return self.runs.start(run, lambda r: self._run(r, url, headers or {}), "load-sweep", "the sweep")

    def get(self, run_id: str) -> OpenRun:
        return self.runs.get(run_id, OpenRun, "no such sweep (the server keeps the latest few)")

    def _turns(self, run: OpenRun):
        spec = run.spec
        key = (spec.backend, spec.max_new_tokens, spec.probe, spec.sweep.num_prompts)
        if key not in self._references:
            run.message = "references: each request alone first, for the judge and the first rate"
            self._references[key] = open_turns(self.engines[spec.backend], min(6, max(1, spec.sweep.num_prompts // 2)),
                                               spec.max_new_tokens, spec.probe or None, spec.backend)
        return self._references[key]

    def _run(self, run: OpenRun, url: str, headers: dict) -> None:
        def started(sweep: Sweep) -> None:
            run.sweeps.append(sweep)
            run.message = f"max batch {sweep.max_batch}: first level…" if sweep.max_batch else "first level…"

        turns, probe = self._turns(run)
        run.status = "running"
        run.results = open_sweeps(self.engines[run.spec.backend], url, turns, probe, run.spec.sweep,
                                  run.spec.max_batches, backend=run.spec.backend, headers=headers, stop=run.stop,
                                  on_sweep=started, out=lambda line: setattr(run, "message", line))


PROBE_DEFAULT = PROBE_PROMPT
