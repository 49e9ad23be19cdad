"""`SpeculativeDecoding`: a `Decoding` whose step guesses tokens and verifies them in one target pass."""

from __future__ import annotations

from dataclasses import replace

from engine.core.errors import InvalidRequest
from engine.core import clock
from engine.serving.decoding import Decoding, cache_capacity
from engine.speculative.costs import (
    DEFAULT_COSTS,
    matmul_weight_ratio,
    measured_costs,
    measured_draft_cost,
)
from engine.speculative.lookup_policy import LookupPolicy
from engine.speculative.policy import AdaptiveK
from engine.speculative.proposers import DraftModel, PromptLookup
from engine.speculative.replay import DraftLog
from engine.speculative.verification import verify_greedy, verify_sampling

MAX_K_CHANGES_KEPT = 64


class SpeculativeDecoding(Decoding):
    """A `Decoding` whose step guesses tokens with a proposer and verifies them in one target pass.

    Same constructor contract as `Decoding` (a prefix cache may hand it `cache`/`cached_tokens`);
    the draft model, if any, prefills the whole prompt into its own cache on its first step, so
    speculation adds nothing to the time to first token.
    """

    def __init__(self, model, prompt_ids: list[int], config, cache=None, cached_tokens: int = 0, draft=None):
        super().__init__(model, prompt_ids, config, cache=cache, cached_tokens=cached_tokens)
        capacity = cache_capacity(self.prompt_len, config)
        costs = measured_costs(model) if config.speculative_adaptive else DEFAULT_COSTS
        if config.speculative == "prompt_lookup":
            self.proposer = PromptLookup()
            self.policy = LookupPolicy(config.num_speculative_tokens, costs, adaptive=config.speculative_adaptive)
        elif config.speculative == "draft":
            if draft is None:
                raise InvalidRequest("speculative='draft' needs a draft model, and none is loaded: start the engine "
                                     "with --draft-model PATH (the bundled model has one built in)", "speculative")
            self.proposer = DraftModel(draft, capacity, model.vocab_size)
            prior = 0.4
            draft_cost = (measured_draft_cost(draft.model, model) if config.speculative_adaptive
                          else matmul_weight_ratio(draft.model, model))
            costs = replace(costs, draft_cost=draft_cost)
            self.policy = AdaptiveK(config.num_speculative_tokens, adaptive=config.speculative_adaptive,
                                    prior_acceptance=prior, draft_cost=draft_cost,
                                    verify_fixed=costs.verify_fixed, verify_per_token=costs.verify_per_token)
        else:
            raise InvalidRequest(f"speculative={config.speculative!r} is not a speculative mode", "speculative")
        self.costs = costs
        # Each verify's drafts, for the replay, priced by measured costs even where the policy was told
        # not to adapt (fixed k decides with the defaults): the prediction needs this machine's figures,
        # measured once per process (the idle worker usually has; else this request's setup pays once).
        log_costs = costs if costs.measured else replace(measured_costs(model), draft_cost=costs.draft_cost)
        self.log = DraftLog(log_costs, log_costs.draft_cost or 0.0)
        self.drafted = self.accepted = self.steps = self.step_tokens = self.backoffs = 0
        self.accepted_hist = [0] * (config.num_speculative_tokens + 1)
        self.k_changes: list[dict] = []
        self.k_change_count = 0
        self.draft_ns = self.verify_ns = 0
        self._last_k = None

    def step(self) -> list[int]:
        room = max(0, min(self.config.max_new_tokens - len(self.output_ids) - 1,  # the bonus token always comes
                          self.model.max_context - len(self.ids) - 1))
        if isinstance(self.policy, LookupPolicy):
            return self._lookup_step(room)
        k = self.policy.choose(room, False)
        if not self.policy.probing:
            self._note_k(k)
        if k == 0:
            return self._plain_step()
        guesses, q = self._propose(k)
        return self._speculative_step(guesses, q) if guesses else self._plain_step()

    def _lookup_step(self, room: int) -> list[int]:
        """Look first (a few dict lookups), watch the proposal for free, then verify it only if
        its kind of proposal is predicted to pay here (engine/speculative/lookup_policy.py)."""
        guesses, _ = self._propose(self.config.num_speculative_tokens)
        key = self.policy.key_for(self.proposer.matched_n)
        self.policy.track(guesses, key)
        if not guesses:  # nothing to guess from: no decision to make
            return self._plain_step()
        k = self.policy.choose(len(guesses), room, key)
        self._note_k(k)
        return self._speculative_step(guesses[:k], None, key) if k else self._plain_step()

    def _propose(self, k: int):
        """The proposer's guesses (up to k), timed as `draft_ms`."""
        t0 = clock.now_ns()
        try:
            return self.proposer.propose(self.ids, k, self.sampler)
        finally:
            self.draft_ns += clock.done_ns(self.device) - t0

    def _plain_step(self) -> list[int]:
        out = super().step()
        self.steps += 1
        self.step_tokens += 1
        self.log.plain()
        if isinstance(self.policy, LookupPolicy):  # score the watched proposals on the new token
            self.policy.advance(out)
        return out

    def _speculative_step(self, guesses: list[int], q, key=None) -> list[int]:
        k, before = len(guesses), len(self.ids)
        t0 = clock.now_ns()
        logits = self.model.forward(self._tensor([self.ids[-1], *guesses]), self.cache, all_logits=True)
        self.forward_passes += 1
        new = verify_greedy(guesses, logits) if self.sampler.greedy else verify_sampling(guesses, q, logits, self.sampler)
        spent = clock.done_ns(self.device) - t0
        self.verify_ns += spent
        accepted = len(new) - 1
        self.cache.crop(before + accepted)  # keep the last committed token and the accepted guesses
        self.proposer.after_verify(before, accepted)
        if isinstance(self.policy, LookupPolicy):
            self.policy.advance(new)
        else:
            self.policy.observe(k, accepted, key)
        self.drafted += k
        self.accepted += accepted
        self.accepted_hist[accepted] += 1
        self.steps += 1
        self.step_tokens += len(new)
        self.log.verified(len(self.output_ids), guesses, accepted)
        return self._accept(new)

    def _note_k(self, k: int) -> None:
        if k == self._last_k:
            return
        if k == 0 and self._last_k:
            self.backoffs += 1
        self.k_change_count += 1
        if len(self.k_changes) < MAX_K_CHANGES_KEPT:  # the Timeline stays small on long replies
            self.k_changes.append({"token": len(self.output_ids), "k": k,
                                   "acceptance_estimate": round(self.policy.acceptance, 3)})
        self._last_k = k

    def truncate(self, length: int) -> None:
        super().truncate(length)
        if isinstance(self.proposer, DraftModel):
            self.proposer.cache.crop(min(self.proposer.cache.length, max(length - 1, 0)))

    def counters(self) -> dict:
        """Speculation figures for the Timeline (glossary names)."""
        return {
            **super().counters(),
            "speculative": self.config.speculative,
            "num_speculative_tokens": self.config.num_speculative_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "tokens_per_step": round(self.step_tokens / self.steps, 3) if self.steps else None,
            "accepted_hist": list(self.accepted_hist),  # [m]: verify steps that accepted m guesses
            "target_forward_passes": self.forward_passes,
            "draft_forward_passes": getattr(self.proposer, "forward_passes", 0),
            "draft_ms": round(self.draft_ns / 1e6, 3),
            "verify_ms": round(self.verify_ns / 1e6, 3),
            "backoffs": self.backoffs,
            "k_changes": self.k_changes,  # the first MAX_K_CHANGES_KEPT
            "k_change_count": self.k_change_count,
            "cost_model": self.costs.to_dict(),  # in plain steps, measured once per process and model
            **self.log.counters(),  # draft_steps, draft_step_count, predicted_speedup (replay.py)
        }
