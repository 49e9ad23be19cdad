"""What each speculative step drafted and how much of it the target kept, small and typed, so a
reply can be replayed step by step (the page's speculation replay, ui/insight/replay.py), and what the
measured acceptance and verify costs predict for its speed.

A `DraftStep` is one verify: where in the output its tokens start, the drafted ids, and how many
of them the target accepted (the target's own next token follows them). On the Timeline
(`counters.speculation.draft_steps`) each is `[at, accepted, [drafted ids]]`; the first MAX_STEPS_KEPT only
(`draft_step_count` says how many there were), so a long reply's record stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_STEPS_KEPT = 1024


@dataclass(frozen=True)
class DraftStep:
    at: int  # output token index of the step's first token
    drafted: tuple[int, ...]  # the proposer's guesses, in order
    accepted: int  # how many of them the target accepted (a prefix)

    def to_list(self) -> list:
        return [self.at, self.accepted, list(self.drafted)]

    @classmethod
    def from_list(cls, raw) -> DraftStep:
        at, accepted, drafted = raw
        return cls(int(at), tuple(int(t) for t in drafted), int(accepted))


class DraftLog:
    """The steps of one reply, and the cost they predict: every step priced in plain decode steps
    by the measured `CostModel` (a verify of k guesses: `verify(k + 1)`, plus k draft tokens at
    `draft_cost` for a draft model), a plain step at 1."""

    def __init__(self, costs, draft_cost: float = 0.0):
        self.costs, self.draft_cost = costs, draft_cost
        self.steps: list[DraftStep] = []
        self.count = 0
        self.tokens = 0  # decode tokens the steps produced
        self.cost = 0.0  # in plain steps

    def plain(self) -> None:
        self.tokens += 1
        self.cost += 1.0

    def verified(self, at: int, drafted: list[int], accepted: int) -> None:
        self.count += 1
        if len(self.steps) < MAX_STEPS_KEPT:
            self.steps.append(DraftStep(at, tuple(drafted), accepted))
        self.tokens += accepted + 1
        self.cost += self.costs.verify(len(drafted) + 1) + len(drafted) * self.draft_cost

    @property
    def predicted_speedup(self) -> float | None:
        """Tokens per plain-step cost: what the measured acceptance and costs predict against plain
        decoding (1: no gain; below 1: speculation costs time)."""
        return self.tokens / self.cost if self.cost else None


def acceptance_by_position(steps: list[DraftStep]) -> list[float | None]:
    """For draft position j (1st guess, 2nd, ...): of the steps that drafted at least j tokens, the
    share whose j-th guess was accepted."""
    k = max((len(s.drafted) for s in steps), default=0)
    out = []
    for j in range(1, k + 1):
        drafted = [s for s in steps if len(s.drafted) >= j]
        out.append(sum(s.accepted >= j for s in drafted) / len(drafted) if drafted else None)
    return out
