"""`Speculation`: one request's speculative decoding, as the decode loop (engine/serving/decoding.py) asks it.

Each step the decoding asks `propose` for up to k guesses (a `Proposal`: prompt lookup or the draft
model, k chosen by their policies); where it gets some, it has the runner verify [last token, *guesses]
in one pass with every row's logits and hands them to `verify` (greedy or speculative sampling:
the output stays the target's), then crops its cache to what was accepted and tells `verified`; a
step without guesses is a plain step, told to `plain`. Speculation keeps the draft's cache, the
policy's statistics, the counters and the replay log; it never runs the target itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.core import clock
from engine.core.counters import SpeculationCounters
from engine.core.errors import InvalidRequest
from engine.speculative.costs import DEFAULT_COSTS, matmul_weight_ratio, measured_costs, measured_draft_cost
from engine.speculative.lookup_policy import LookupPolicy
from engine.speculative.policy import AdaptiveK
from engine.speculative.proposers import DraftModel, PromptLookup
from engine.speculative.replay import DraftLog
from engine.speculative.verification import verify_greedy, verify_sampling

MAX_K_CHANGES_KEPT = 64


@dataclass(frozen=True)
class Proposal:
    """Guesses for the tokens after the committed ones; `q`: the distribution each was drawn from (None:
    point masses, prompt lookup's); `key`: the kind of guess the policy tracks."""

    tokens: list[int]
    q: torch.Tensor | None = None
    key: object = None


class Speculation:
    """A request's proposer, its policy, and what it drafted and kept. `target`: the runner of the model
    that verifies (its measured costs price a verify); `prompt_len`: the request's prompt tokens;
    `capacity`: its KV positions; `draft`: the loaded draft (speculative='draft'). Raises
    InvalidRequest for a mode that cannot run (no draft loaded)."""

    def __init__(self, target, config, prompt_len: int, capacity: int, draft=None):
        self.config, self.prompt_len, self.device = config, prompt_len, target.device
        costs = measured_costs(target) if config.speculative_adaptive else DEFAULT_COSTS
        if config.speculative == "prompt_lookup":
            self.proposer = PromptLookup()
            self.policy = LookupPolicy(config.num_speculative_tokens, costs, adaptive=config.speculative_adaptive)
        elif config.speculative == "draft":
            if draft is None:
                raise InvalidRequest("speculative='draft' needs a draft model, and none is loaded: start the engine "
                                     "with --draft-model PATH (the bundled model has one built in)", "speculative")
            self.proposer = DraftModel(draft, capacity, target.vocab_size)
            draft_cost = (measured_draft_cost(draft.runner, target) if config.speculative_adaptive
                          else matmul_weight_ratio(draft.model, target.model))
            costs = replace(costs, draft_cost=draft_cost)
            self.policy = AdaptiveK(config.num_speculative_tokens, adaptive=config.speculative_adaptive,
                                    prior_acceptance=0.4, draft_cost=draft_cost,
                                    verify_fixed=costs.verify_fixed, verify_per_token=costs.verify_per_token)
        else:
            raise InvalidRequest(f"speculative={config.speculative!r} is not a speculative mode", "speculative")
        self.costs = costs
        # Each verify's drafts, for the replay, priced by measured costs even where the policy was told
        # not to adapt (fixed k decides with the defaults): the prediction needs this machine's figures,
        # measured once per process (the idle worker usually has; else this request's setup pays once).
        log_costs = costs if costs.measured else replace(measured_costs(target), draft_cost=costs.draft_cost)
        self.log = DraftLog(log_costs, log_costs.draft_cost or 0.0)
        self.drafted = self.accepted = self.steps = self.step_tokens = self.backoffs = 0
        self.accepted_hist = [0] * (config.num_speculative_tokens + 1)
        self.k_changes: list[dict] = []
        self.k_change_count = 0
        self.draft_ns = self.verify_ns = 0
        self._last_k = None

    @property
    def draft_cache(self):
        """The draft model's KV cache (None: prompt lookup keeps none)."""
        return getattr(self.proposer, "cache", None)

    def propose(self, ids: list[int], room: int, sampler) -> Proposal | None:
        """Guesses for the step after `ids` (None: a plain step). `room`: the most guesses still useful."""
        if isinstance(self.policy, LookupPolicy):
            # look first (a few dict lookups), watch the proposal for free, then verify it only if its
            # kind of proposal is predicted to pay here (engine/speculative/lookup_policy.py)
            guesses, _ = self._propose(ids, self.config.num_speculative_tokens, sampler)
            key = self.policy.key_for(self.proposer.matched_n)
            self.policy.track(guesses, key)
            if not guesses:  # nothing to guess from: no decision to make
                return None
            k = self.policy.choose(len(guesses), room, key)
            self._note_k(k, len(ids))
            return Proposal(guesses[:k], None, key) if k else None
        k = self.policy.choose(room, False)
        if not self.policy.probing:
            self._note_k(k, len(ids))
        if k == 0:
            return None
        guesses, q = self._propose(ids, k, sampler)
        return Proposal(guesses, q) if guesses else None

    def _propose(self, ids, k: int, sampler):
        """The proposer's guesses (up to k), timed as `draft_ms`."""
        t0 = clock.now_ns()
        try:
            return self.proposer.propose(ids, k, sampler)
        finally:
            self.draft_ns += clock.done_ns(self.device) - t0

    def verify(self, proposal: Proposal, logits: torch.Tensor, sampler) -> list[int]:
        """The tokens a verify pass commits: the accepted guesses and the target's own next token.
        `logits`: the target's, every row of [last committed token, *guesses]."""
        if sampler.greedy:
            return verify_greedy(proposal.tokens, logits)
        return verify_sampling(proposal.tokens, proposal.q, logits, sampler)

    def verified(self, proposal: Proposal, new: list[int], committed_before: int, output_len: int,
                 spent_ns: int) -> None:
        """A verify pass committed `new` after `committed_before` tokens (`output_len` of them output),
        in `spent_ns` (the pass and the verification)."""
        k, accepted = len(proposal.tokens), len(new) - 1
        self.verify_ns += spent_ns
        self.proposer.after_verify(committed_before, accepted)
        if isinstance(self.policy, LookupPolicy):
            self.policy.advance(new)
        else:
            self.policy.observe(k, accepted, proposal.key)
        self.drafted += k
        self.accepted += accepted
        self.accepted_hist[accepted] += 1
        self.steps += 1
        self.step_tokens += len(new)
        self.log.verified(output_len, proposal.tokens, accepted)

    def plain(self, emitted: list[int]) -> None:
        """A plain step emitted `emitted`."""
        self.steps += 1
        self.step_tokens += 1
        self.log.plain()
        if isinstance(self.policy, LookupPolicy):  # score the watched proposals on the new token
            self.policy.advance(emitted)

    def truncate(self, length: int) -> None:
        """The sequence keeps its first `length` ids: the draft's cache keeps at most all but the last."""
        if self.draft_cache is not None:
            self.draft_cache.crop(min(self.draft_cache.length, max(length - 1, 0)))

    def _note_k(self, k: int, ids_len: int) -> None:
        if k == self._last_k:
            return
        if k == 0 and self._last_k:
            self.backoffs += 1
        self.k_change_count += 1
        if len(self.k_changes) < MAX_K_CHANGES_KEPT:  # the Timeline stays small on long replies
            self.k_changes.append({"token": ids_len - self.prompt_len, "k": k,
                                   "acceptance_estimate": round(self.policy.acceptance, 3)})
        self._last_k = k

    def counters(self, target_forward_passes: int) -> SpeculationCounters:
        """Speculation figures for the Timeline's `counters.speculation` (glossary names)."""
        log, speedup = self.log, self.log.predicted_speedup
        return SpeculationCounters(
            speculative=self.config.speculative,
            num_speculative_tokens=self.config.num_speculative_tokens,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=round(self.accepted / self.drafted, 4) if self.drafted else None,
            tokens_per_step=round(self.step_tokens / self.steps, 3) if self.steps else None,
            accepted_hist=list(self.accepted_hist),  # [m]: verify steps that accepted m guesses
            target_forward_passes=target_forward_passes,
            draft_forward_passes=getattr(self.proposer, "forward_passes", 0),
            draft_ms=round(self.draft_ns / 1e6, 3),
            verify_ms=round(self.verify_ns / 1e6, 3),
            backoffs=self.backoffs,
            k_changes=list(self.k_changes),  # the first MAX_K_CHANGES_KEPT
            k_change_count=self.k_change_count,
            cost_model=self.costs.to_dict(),  # in plain steps, measured once per process and model
            draft_steps=[s.to_list() for s in log.steps],  # the replay log (replay.py): the first MAX_STEPS_KEPT
            draft_step_count=log.count,
            predicted_speedup=None if speedup is None else round(speedup, 3),
            plain_step_ms=log.costs.step_ms,  # the plain step the costs were measured against
        )
