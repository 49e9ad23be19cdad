"""How many tokens to guess each step (`AdaptiveK`), from measured acceptance and a cost model."""

from __future__ import annotations

from engine.speculative.costs import VERIFY_COST_PER_TOKEN, VERIFY_FIXED_COST


class AdaptiveK:
    """Choose k (0..max_k) each step to maximise expected tokens per unit of work.

    With a per-token acceptance a, a step guessing k tokens yields E(k) = 1 + a + ... + a^k tokens
    and costs verify(k+1) + k * draft_cost, in units of one plain decode step, with verify(T) =
    1 + VERIFY_FIXED_COST + VERIFY_COST_PER_TOKEN * (T - 1) (`python -m engine.bench verify`, packed
    weights) and draft_cost the draft's matmul work per token relative to the target's. a is
    a decaying average over the guesses examined. k = 0 means a plain step; while at 0, a proposer
    that can be checked for free (prompt lookup) keeps measuring a, and a draft model is probed
    with k = 1 after `probe_every` plain steps, then after twice as many while probes fail (up to
    8x).

    The costs are a `CostModel` measured once per process and model (`measured_costs`), never
    this request's own wall clock: every decision is then a function of the tokens alone, so a
    seeded sampled reply is the same on every run of the process (how many guesses were drawn
    decides which random numbers each token consumes) and a greedy bf16 reply too (a verify pass
    rounds differently from plain steps, see docs/speculative.md, Exactness in bf16). Measured times are still
    reported (`draft_ms`, `verify_ms`).

    Acceptance is tracked per `key`: prompt lookup passes its match length, since a 3-token match
    is right far more often than a 1-token one (guessing on every 1-token match slowed open-ended
    replies: docs/history.md, Speculative decoding).
    """

    def __init__(self, max_k: int, adaptive: bool = True, prior_acceptance: float = 0.6,
                 decay: float = 0.8, probe_every: int = 8, draft_cost: float = 0.0,
                 verify_fixed: float | None = None, verify_per_token: float | None = None, costs=None):
        self.max_k, self.adaptive, self.decay, self.probe_every = max_k, adaptive, decay, probe_every
        self.draft_cost = draft_cost
        self.costs = costs  # a CostModel: its measured verify table; None: the line below
        self.verify_fixed = VERIFY_FIXED_COST if verify_fixed is None else verify_fixed
        self.verify_per_token = VERIFY_COST_PER_TOKEN if verify_per_token is None else verify_per_token
        self.prior = prior_acceptance
        self.stats: dict[object, list[float]] = {}  # key -> [hits, trials], decaying
        self.key = None  # the key of the latest choice
        self.k = max_k
        self.plain_since_probe = 0
        self.probe_interval = probe_every  # grows while probes fail, back to probe_every once guessing pays
        self.probing = False  # this step's k is a probe, not a decision

    def _stats(self, key) -> list[float]:
        return self.stats.setdefault(key, [2 * self.prior, 2.0])  # the prior: worth two observed guesses

    def acceptance_for(self, key=None) -> float:
        hits, trials = self._stats(key)
        return hits / trials

    @property
    def acceptance(self) -> float:
        return self.acceptance_for(self.key)

    def observe(self, guessed: int, accepted: int, key=None) -> None:
        examined = accepted + (1 if accepted < guessed else 0)
        if examined:
            st = self._stats(key)
            st[0] = self.decay * st[0] + accepted
            st[1] = self.decay * st[1] + examined

    def cost(self, k: int) -> float:
        """A step guessing k tokens, in plain steps."""
        if not k:
            return 1.0
        if self.costs is not None:
            return self.costs.verify(k + 1) + k * self.draft_cost
        return 1.0 + self.verify_fixed + k * (self.verify_per_token + self.draft_cost)

    def choose(self, room: int, free_probe: bool, key=None) -> int:
        """k for the next step (room: the most guesses still useful; key: what kind of guess)."""
        self.key = key
        if not self.adaptive:
            return max(0, min(self.max_k, room))
        a = min(self.acceptance_for(key), 0.999)
        self.probing = False
        best_k, best = 0, 1.0
        expected = 1.0
        for k in range(1, self.max_k + 1):
            expected += a**k
            rate = expected / self.cost(k)
            if rate > best * 1.02:  # a 2% margin: do not speculate for a noise-level gain
                best_k, best = k, rate
        if best_k == 0 and not free_probe:
            self.plain_since_probe += 1
            if self.plain_since_probe >= self.probe_interval:
                self.plain_since_probe = 0
                # a probe costs a verify pass and a draft token; while probes keep saying "no",
                # probe half as often (8, 16, 32, 64 plain steps)
                self.probe_interval = min(self.probe_interval * 2, 8 * self.probe_every)
                best_k, self.probing = 1, True
        elif best_k > 0:
            self.probe_interval = self.probe_every
        self.k = min(best_k, room)
        return self.k
