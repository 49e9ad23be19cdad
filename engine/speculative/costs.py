"""What a speculative step costs on this machine, in plain decode steps: `CostModel`, measured
once per process and model (`measured_costs`), then fixed so that seeded replies stay reproducible."""

from __future__ import annotations

import statistics
import threading
from dataclasses import asdict, dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from engine.platform.decisions import Interrupted, race

# A verify pass over T = k + 1 tokens costs 1 + fixed + k * per_token plain steps. These defaults,
# fitted to `python -m engine.bench verify` (figures: docs/speculative.md), serve only where
# nothing was measured: a speculative decoding measures its model's own (`measured_costs`).
VERIFY_FIXED_COST = 0.2
VERIFY_COST_PER_TOKEN = 0.03

# The calibration: forwards of T = 1 and each CALIBRATION_SIZES tokens after CALIBRATION_CONTEXT
# cached ones, alternating, CALIBRATION_ROUNDS times (after one warm-up round). Each T is priced by
# the median over rounds of its time / the same round's T = 1 time: paired, so a neighbour's load
# that slows a whole round cancels out (these machines are shared). A table: on some
# CPUs the costs are not a line through T = 2 and 9 (`python -m engine.bench verify`; docs/speculative.md).
CALIBRATION_CONTEXT = 64
CALIBRATION_SIZES = (2, 3, 5, 9)  # k = 8, the lookup bench's default, is T = 9; larger T extrapolates the last slope
CALIBRATION_ROUNDS = 6


@dataclass(frozen=True)
class CostModel:
    """What one speculative step costs, in plain decode steps of this model on this machine."""

    verify_fixed: float  # the line: a verify pass over T tokens ~ 1 + verify_fixed + (T - 1) * verify_per_token
    verify_per_token: float
    step_ms: float | None = None  # the median plain step (T = 1) it was measured against
    draft_cost: float | None = None  # one draft token (a draft forward of T = 1), when a draft was measured
    measured: bool = True
    verify_steps: tuple[tuple[int, float], ...] | None = None  # measured (T, plain steps); None: the line only

    def verify(self, tokens: int) -> float:
        """A verify pass over `tokens` (= k + 1), in plain steps: the measured table, linear between
        its points, the last segment's slope past its end; the line where nothing was measured."""
        if tokens <= 1:
            return 1.0
        if not self.verify_steps:
            return 1.0 + self.verify_fixed + (tokens - 1) * self.verify_per_token
        points = [(1, 1.0), *self.verify_steps]
        for (t0, c0), (t1, c1) in zip(points, points[1:]):
            if tokens <= t1:
                return c0 + (c1 - c0) * (tokens - t0) / (t1 - t0)
        (t0, c0), (t1, c1) = points[-2], points[-1]
        return c1 + max(0.0, (c1 - c0) / (t1 - t0)) * (tokens - t1)

    def to_dict(self) -> dict:
        d = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        if self.verify_steps is not None:
            d["verify_steps"] = [[t, round(c, 3)] for t, c in self.verify_steps]
        return d


DEFAULT_COSTS = CostModel(VERIFY_FIXED_COST, VERIFY_COST_PER_TOKEN, measured=False)
_MEASURED = WeakIdKeyDictionary()  # target model -> CostModel; (draft, target) below (keyed by the model a runner runs)
_MEASURED_DRAFT = WeakIdKeyDictionary()  # draft model -> {target model -> draft token cost}
_MEASURE_LOCK = threading.Lock()
_IDLE_FAILED = WeakIdKeyDictionary()  # models whose idle calibration raised (calibrate_idle skips them)


def _timed_forwards(runs: list[tuple[object, int]], rounds: int, should_stop=None) -> list[list[float]]:
    """Seconds of each run's forward — (runner, T): T tokens after CALIBRATION_CONTEXT cached ones —
    once per round, the runs alternating within each round (the one race, engine/platform/decisions.py,
    so ratios can be paired by round; its first round warms up and is dropped). `should_stop()` true
    before a round raises Interrupted (a request came: it waits one round at most)."""
    gen = torch.Generator().manual_seed(0)
    caches, ids = {}, {}
    for runner, _ in runs:
        if id(runner) not in caches:
            context = torch.randint(0, runner.vocab_size, (CALIBRATION_CONTEXT,), generator=gen).to(runner.device)
            caches[id(runner)] = cache = runner.new_cache(CALIBRATION_CONTEXT + max(t for _, t in runs) + 1)
            runner.forward(context, cache)

    def prepare(name):  # untimed: the cache back to its context, this run's tokens
        runner, t = runs[int(name)]
        caches[id(runner)].crop(CALIBRATION_CONTEXT)
        ids[name] = torch.randint(0, runner.vocab_size, (t,), generator=gen).to(runner.device)

    def run(name):
        runner, t = runs[int(name)]
        return lambda: runner.forward(ids[name], caches[id(runner)], all_logits=t > 1)

    device = runs[0][0].device
    result = race({str(i): run(str(i)) for i in range(len(runs))}, rounds, device, prepare=prepare,
                  should_stop=should_stop)
    return [result.times[str(i)] for i in range(len(runs))]


def cost_model_from_times(times: dict[int, list[float]]) -> CostModel:
    """The cost model from per-round forward times (T = 1 and CALIBRATION_SIZES): paired ratios."""
    one = times[1]
    table = tuple((t, max(1.0, statistics.median(a / b for a, b in zip(times[t], one))))
                  for t in sorted(times) if t > 1)
    steps = dict(table)
    first, last = table[0][0], table[-1][0]
    per_token = max(0.0, (steps[last] - steps[first]) / (last - first)) if last > first else 0.0
    fixed = max(0.0, steps[first] - 1.0 - per_token * (first - 1))
    return CostModel(fixed, per_token, step_ms=statistics.median(one) * 1e3, verify_steps=table)


def measured_costs(runner, should_stop=None) -> CostModel:
    """The verify cost model of `runner`'s model on this machine: measured once per process (~35 forwards;
    its time is in docs/speculative.md), then the same for every later request, so decisions stay a function of
    the tokens alone. Each model object (a quantized variant too) gets its own. The engine's worker
    measures it while idle (`calibrate_idle`); a speculative request that comes first measures it
    in its setup. `should_stop` as in `_timed_forwards`."""
    with _MEASURE_LOCK:
        costs = _MEASURED.get(runner.model)
        if costs is None:
            sizes = [1, *CALIBRATION_SIZES]
            runs = _timed_forwards([(runner, t) for t in sizes], CALIBRATION_ROUNDS, should_stop)
            costs = _MEASURED[runner.model] = cost_model_from_times(dict(zip(sizes, runs)))
        return costs


def measured_draft_cost(draft_runner, target_runner, should_stop=None) -> float:
    """A draft token's cost in target decode steps: the median over rounds of a draft step / the
    same round's target step, measured here once per process (paired, like the verify table: a
    neighbour's load that slows a round slows both). Decode is memory-bound, but at this size
    per-step overhead counts too: the weight ratio `matmul_weight_ratio` alone underestimates it."""
    measured_costs(target_runner, should_stop)
    with _MEASURE_LOCK:
        per_target = _MEASURED_DRAFT.setdefault(draft_runner.model, WeakIdKeyDictionary())
        cost = per_target.get(target_runner.model)
        if cost is None:
            target, draft = _timed_forwards([(target_runner, 1), (draft_runner, 1)], CALIBRATION_ROUNDS, should_stop)
            cost = per_target[target_runner.model] = statistics.median(d / t for d, t in zip(draft, target))
        return cost


def is_calibrated(model, draft_model=None) -> bool:
    """Whether `model`'s cost model (and with a draft, the draft's cost against it) is measured."""
    if model not in _MEASURED:
        return False
    return draft_model is None or model in _MEASURED_DRAFT.get(draft_model, {})


def calibrate_idle(targets, should_stop) -> bool:
    """Measure the next uncalibrated model's costs (the worker's idle work: the first speculative
    request then pays nothing for it: docs/speculative.md has what it cost that request). `targets`:
    (runner, draft or None) of each resident variant. Returns whether it measured one (False: all
    done, or `should_stop` interrupted it: a request came, and is served first)."""
    for runner, draft in targets:
        model, draft_runner = runner.model, getattr(draft, "runner", None)
        if is_calibrated(model, getattr(draft_runner, "model", None)) or model in _IDLE_FAILED:
            continue
        try:
            if draft_runner is not None:
                measured_draft_cost(draft_runner, runner, should_stop)
            else:
                measured_costs(runner, should_stop)
        except Interrupted:
            return False
        except Exception:  # e.g. out of memory: not retried while idle; a request measures (or fails) on its own
            _IDLE_FAILED[model] = True
            raise
        return True
    return False


def matmul_weight_ratio(draft_model, target_model) -> float:
    """A draft token's cost relative to a target step, as the ratio of the weights their matmuls
    read (decode is memory-bound: a step costs about the bytes it reads). The bundled draft: ~0.09;
    `measured_draft_cost` times it (docs/speculative.md)."""
    def linear_bytes(m):
        return sum(mod.weight.numel() * mod.weight.element_size() for mod in m.modules()
                   if isinstance(mod, torch.nn.Linear))

    target = linear_bytes(target_model)
    return linear_bytes(draft_model) / target if target else 0.15
