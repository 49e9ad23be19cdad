"""When prompt lookup's guesses are worth a verify pass, and how many of them to check.

A verify pass is dear on some machines (nearly two plain steps even for k = 1 on some CPUs:
`python -m engine.bench verify`, docs/speculative.md), so a rejected guess costs more than it can win. `LookupPolicy` therefore guesses only
when the tokens it expects to gain beat the measured cost (`CostModel.verify`), with a margin.

What it expects comes from watching every proposal for free. Each step the lookup proposes up to
max_k tokens; the policy tracks that proposal against the tokens the decoding then emits, whether
or not it was verified (a "shadow"): position j of a proposal either matches the j-th token emitted
after it (a hit) or not (a miss, and the shadow ends). Per kind of proposal (`key`) it keeps s_j,
the decaying rate of hits at position j among proposals right up to j - 1, so the chance that the
first j guesses are all right is S_j = s_1 ... s_j, and guessing k yields 1 + S_1 + ... + S_k tokens.
That survival curve, not one per-token rate, is what lookup needs: in open text a 3-token match
is often right once and then wrong; inside a copy it is right for dozens of tokens.

The key is (a 1-token match or a longer one, `in_copy`); `in_copy`: whether the previous step's
proposal was right on every token that step emitted. Inside a copy a proposal is right far more often than just after one
ended, so one miss switches to the pessimistic statistics at once (fast back-off), and one hit
returns to the copy's (fast re-entry). Decisions depend on the tokens alone and on the cost model
fixed for the process: a seeded reply is the same on every run.
"""

from __future__ import annotations

MARGIN = 1.20  # guess only for a predicted gain of 20%+ (estimates are noisy): chosen by replaying
# `python -m engine.bench lookup`'s prompts offline against 1.1 (docs/history.md, Speculative decoding)
DECAY = 0.85  # per observation of a (key, position): ~7 recent ones count
PRIOR_RATE, PRIOR_WEIGHT = 0.5, 1.0  # a position never observed: a coin toss, worth one observation


class LookupPolicy:
    """Choose k (0..max_k) for a prompt-lookup proposal from its key's survival curve and the costs."""

    def __init__(self, max_k: int, costs, adaptive: bool = True, margin: float = MARGIN):
        self.max_k, self.costs, self.adaptive, self.margin = max_k, costs, adaptive, margin
        self.stats: dict[object, list[list[float]]] = {}  # key -> per position [hits, trials], decaying
        self.shadows: list[list] = []  # [key, tokens, next position]: proposals being checked for free
        self.in_copy = False  # the previous step's proposal was right on every token that step emitted
        self.key = None  # the latest choice's key
        self._latest: list[int] = []  # this step's proposal (empty: none)

    def key_for(self, matched_n: int) -> tuple[int, bool]:
        # 2- and 3-token matches pooled: they predict alike, and pooled they learn twice as fast
        # (replayed offline on the lookup bench's prompts: docs/history.md, Speculative decoding)
        return (min(matched_n, 2), self.in_copy)

    def _positions(self, key) -> list[list[float]]:
        return self.stats.setdefault(key, [[PRIOR_RATE * PRIOR_WEIGHT, PRIOR_WEIGHT] for _ in range(self.max_k)])

    def survival(self, key) -> list[float]:
        """S_j for j = 1..max_k: the estimated chance that the first j guesses are all right."""
        out, s = [], 1.0
        for hits, trials in self._positions(key):
            s *= hits / trials
            out.append(s)
        return out

    def acceptance_for(self, key=None) -> float:
        """s_1: how often this key's first guess is right (the Timeline's acceptance_estimate)."""
        hits, trials = self._positions(key)[0]
        return hits / trials

    @property
    def acceptance(self) -> float:
        return self.acceptance_for(self.key)

    def expected_rates(self, key, most: int) -> list[float]:
        """[k - 1]: tokens per plain step's worth of time when guessing k, (1 + S_1 + ... + S_k) / verify(k + 1)."""
        rates, tokens = [], 1.0
        for k, s in enumerate(self.survival(key)[:most], start=1):
            tokens += s
            rates.append(tokens / self.costs.verify(k + 1))
        return rates

    def choose(self, proposed: int, room: int, key) -> int:
        """k for this step: 0 (a plain step) unless guessing is predicted to pay by the margin."""
        self.key = key
        most = max(0, min(proposed, self.max_k, room))
        if not self.adaptive:
            return most
        best_k, best = 0, self.margin
        for k, rate in enumerate(self.expected_rates(key, most), start=1):
            if rate > best:
                best_k, best = k, rate
        return best_k

    def track(self, tokens: list[int], key) -> None:
        """Watch this step's proposal (verified or not) against the tokens that follow."""
        tokens = tokens[: self.max_k]
        self._latest = tokens
        if tokens:
            self.shadows.append([key, tokens, 0])

    def advance(self, emitted: list[int]) -> None:
        """Score every watched proposal on the tokens this step emitted; drop the resolved ones."""
        for token in emitted:
            alive = []
            for shadow in self.shadows:
                key, tokens, pos = shadow
                hit = tokens[pos] == token
                st = self._positions(key)[pos]
                st[0] = DECAY * st[0] + hit
                st[1] = DECAY * st[1] + 1.0
                shadow[2] = pos + 1
                if hit and shadow[2] < len(tokens):
                    alive.append(shadow)
            self.shadows = alive
        latest, self._latest = self._latest, []
        n = min(len(latest), len(emitted))  # this step's own proposal lines up with what it emitted
        self.in_copy = n > 0 and latest[:n] == emitted[:n]
