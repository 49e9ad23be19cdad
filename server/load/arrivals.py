"""When open-loop requests are sent: Poisson, gamma (bursty) or constant inter-arrival times.

As vLLM's `bench serve` draws them (benchmarks/serve.py, `get_request`): each gap is
gamma(shape=burstiness, scale=1/(rate*burstiness)), so the mean gap is 1/rate whatever the
burstiness; burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular. A rate of
inf sends everything at once. `constant` spaces requests exactly 1/rate apart (GuideLLM's
"constant"). Draws come from numpy's seeded Generator: the same seed, the same schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PROCESSES = ("poisson", "constant")  # poisson with burstiness != 1 is gamma


@dataclass(frozen=True)
class Arrivals:
    """An open-loop schedule's settings (`--request-rate`, `--burstiness`, `--num-prompts`,
    `--duration`, `--seed`; `--arrivals` for constant)."""

    rate: float  # requests per second offered; inf: all at once
    burstiness: float = 1.0
    process: str = "poisson"  # poisson (gamma when burstiness != 1) | constant
    num_prompts: int | None = None  # this many requests ...
    duration: float | None = None  # ... or as many as arrive within this many seconds (the first limit reached)
    seed: int = 0

    def __post_init__(self):
        if not (self.rate > 0):
            raise ValueError("request rate must be > 0 (inf: all at once)")
        if not (self.burstiness > 0):
            raise ValueError("burstiness must be > 0")
        if self.process not in PROCESSES:
            raise ValueError(f"arrivals must be one of {', '.join(PROCESSES)}")
        if self.num_prompts is None and (self.duration is None or math.isinf(self.rate)):
            raise ValueError("give a number of requests (or, at a finite rate, a duration)")

    def times(self) -> list[float]:
        return arrival_times(self)


def gaps(n: int, rate: float, burstiness: float = 1.0, process: str = "poisson", seed: int = 0) -> np.ndarray:
    """`n` inter-arrival gaps in seconds (the first request waits one gap, as in vLLM)."""
    if math.isinf(rate):
        return np.zeros(n)
    if process == "constant":
        return np.full(n, 1.0 / rate)
    rng = np.random.default_rng(seed)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrival_times(a: Arrivals) -> list[float]:
    """Send times (seconds after the start) of the schedule: `num_prompts` of them, or those within
    `duration`, whichever ends first."""
    if a.num_prompts is not None:
        n = a.num_prompts
    else:  # enough draws to cover the duration with room to spare, then cut
        n = max(1, int(a.rate * a.duration * 2 + 20))
    t = np.cumsum(gaps(n, a.rate, a.burstiness, a.process, a.seed))
    if a.duration is not None:
        t = t[t <= a.duration]
    return [float(x) for x in t]
