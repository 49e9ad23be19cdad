"""Speculative decoding: guess several tokens cheaply, check them all in one target forward pass.

Decode is memory-bound: a forward pass over k+1 tokens costs little more than over one, so a
step that verifies k guesses can yield up to k+1 tokens for about the price of one.

* Proposers guess the next tokens. `PromptLookup` finds the last few tokens earlier in the
  prompt or the reply and proposes what followed them there (no model). `DraftModel` runs a
  small causal LM that shares the target's tokenizer, with a KV cache of its own.
* Verification keeps the output exactly the target's. Greedy: accept the longest prefix of the
  guesses that equals the target's own argmax choices, then add the target's next token.
  Sampling: standard speculative sampling (Leviathan et al. 2023, Chen et al. 2023): accept a
  guess d with probability min(1, p(d)/q(d)), else draw from the normalised residual
  max(0, p - q) and stop; when all are accepted, draw a bonus token from p. The result is
  distributed exactly as the target's sampler (`Sampler.probs`) would draw.
* Caches roll back on rejection: the target's to the accepted prefix, the draft's likewise.
* `AdaptiveK` chooses how many tokens to guess each step from the measured acceptance and a
  cost model of a verify pass and of a draft token (`CostModel`), measured on the loaded model
  the first time it speculates and then fixed for the process (so that the same seed gives the
  same reply); when guessing stops paying it guesses none, and the Timeline records each change
  (`k_changes`).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .decoding import Decoding, cache_capacity
from .errors import InvalidRequest


# --- proposers -------------------------------------------------------------------------------
class PromptLookup:
    """Propose the continuation of the latest earlier occurrence of the sequence's last n tokens.

    Tries n = max_ngram down to min_ngram. An index from each n-gram to the position after its
    latest occurrence is kept up to date as tokens arrive, so a proposal costs a few dict lookups.
    """

    name = "prompt_lookup"
    free_probe = True  # its guess can be checked against the real next token at no cost

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # continuations starting at positions < indexed are in the index
        self.matched_n = 0  # the last proposal's match length

    def _update(self, ids: list[int]) -> None:
        for j in range(max(self.indexed, 1), len(ids)):  # j: where the continuation starts
            for n in range(self.min_ngram, self.max_ngram + 1):
                if j >= n:
                    self.index[tuple(ids[j - n : j])] = j
        self.indexed = len(ids)

    def propose(self, ids: list[int], k: int, sampler) -> tuple[list[int], None]:
        """Up to k tokens; `matched_n` says how long the match was (0: none), because a 3-token
        match predicts far better than a 1-token one and the policy tracks them apart."""
        self._update(ids)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ids) < n:
                continue
            start = self.index.get(tuple(ids[-n:]))
            if start is not None:
                self.matched_n = n
                return ids[start : start + k], None
        self.matched_n = 0
        return [], None

    def after_verify(self, committed_before: int, accepted: int) -> None:
        """Nothing to undo: the index only ever holds committed tokens."""


class DraftModel:
    """Propose by running a small draft LM (`engine.draft.Draft`) k times; it keeps its own KV cache."""

    name = "draft"
    free_probe = False

    def __init__(self, draft, capacity: int, target_vocab: int):
        self.model = draft.model
        self.vocab = draft.vocab  # draft column -> target token id (None: identity)
        self.target_vocab = target_vocab
        self.cache = self.model.new_cache(capacity)
        self.forward_passes = 0
        self._fed_back = 0  # guesses of the last proposal that went into the cache

    def _next(self, tokens: list[int], sampler) -> tuple[int, torch.Tensor | None]:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.model.device)
        logits = self.model.forward(ids, self.cache)[0]
        self.forward_passes += 1
        if self.vocab is not None:
            logits = logits[: self.vocab.numel()]
        if sampler.greedy:
            col = int(logits.argmax())
            return (col if self.vocab is None else int(self.vocab[col])), None
        full = logits.new_full((self.target_vocab,), float("-inf"))
        if self.vocab is None:
            full[: logits.numel()] = logits[: self.target_vocab]
        else:
            full[self.vocab] = logits  # q = 0 for tokens the draft's head does not cover
        q = sampler.probs(full)
        return sampler.draw(q), q

    def propose(self, ids: list[int], k: int, sampler) -> tuple[list[int], torch.Tensor | None]:
        """Guess k tokens after ids. The draft first catches up on committed tokens it has not seen
        (the whole prompt on its first call: its prefill happens here, not before the first token)."""
        tokens, qs = [], []
        feed = ids[self.cache.length :]
        for _ in range(k):
            tok, q = self._next(feed, sampler)
            tokens.append(tok)
            qs.append(q)
            feed = [tok]
        self._fed_back = k - 1  # the last guess is never fed back
        return tokens, (torch.stack(qs) if qs and qs[0] is not None else None)

    def after_verify(self, committed_before: int, accepted: int) -> None:
        """Roll the draft cache back to the committed tokens: it holds the `committed_before` old
        tokens and the guesses fed back; only the accepted ones among those stay."""
        self.cache.crop(min(self.cache.length, committed_before + min(accepted, self._fed_back)))


# --- verification ----------------------------------------------------------------------------
def verify_greedy(guesses: list[int], target_logits: torch.Tensor) -> list[int]:
    """target_logits[i] scores the token after guess i (row 0: after the last committed token).
    Returns the accepted guesses followed by the target's own next token."""
    choice = target_logits.argmax(-1).tolist()
    out = []
    for i, g in enumerate(guesses):
        if g != choice[i]:
            break
        out.append(g)
    out.append(choice[len(out)])
    return out


def verify_sampling(guesses: list[int], q: torch.Tensor | None, target_logits: torch.Tensor, sampler) -> list[int]:
    """Speculative sampling. q[i] is the distribution guess i was drawn from; None means each guess
    was certain (a point mass, as for prompt lookup). Output tokens follow the target's distribution."""
    p = sampler.probs(target_logits)  # [k+1, vocab], processed exactly as plain sampling would
    out = []
    for i, g in enumerate(guesses):
        p_g = float(p[i, g])
        q_g = 1.0 if q is None else float(q[i, g])
        if sampler.uniform() < min(1.0, p_g / q_g):
            out.append(g)
            continue
        residual = p[i].clone()
        if q is None:
            residual[g] = 0.0  # max(0, p - onehot(g))
        else:
            residual = (residual - q[i]).clamp_(min=0.0)
        total = float(residual.sum())
        out.append(sampler.draw(residual / total if total > 0 else p[i]))
        return out
    out.append(sampler.draw(p[len(guesses)]))
    return out


# --- how many tokens to guess ---------------------------------------------------------------------
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
    rounds differently from plain steps, see README: Exactness). Measured times are still
    reported (`draft_ms`, `verify_ms`).

    Acceptance is tracked per `key`: prompt lookup passes its match length, since a 3-token match
    is right far more often than a 1-token one (guessing on every 1-token match cost open-ended
    replies up to 11%).
    """

    def __init__(self, max_k: int, adaptive: bool = True, prior_acceptance: float = 0.6,
                 decay: float = 0.8, probe_every: int = 8, draft_cost: float = 0.0,
                 verify_fixed: float | None = None, verify_per_token: float | None = None):
        self.max_k, self.adaptive, self.decay, self.probe_every = max_k, adaptive, decay, probe_every
        self.draft_cost = draft_cost
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
        return 1.0 + self.verify_fixed + k * (self.verify_per_token + self.draft_cost) if k else 1.0

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


# A verify pass over T = k + 1 tokens costs 1 + fixed + k * per_token plain steps. These defaults
# (the AVX-512 BF16 Zen 5, packed weights: `python -m engine.bench verify` measured 1.10-1.29 for
# T = 2, 1.25-1.38 for 3, 1.23-1.25 for 5, 1.38 for 9) serve only where nothing was measured:
# a speculative decoding measures its model's own (`measured_costs`).
VERIFY_FIXED_COST = 0.2
VERIFY_COST_PER_TOKEN = 0.03
MAX_K_CHANGES_KEPT = 64

# The calibration: forwards of T = 1, 2 and CALIBRATION_T tokens after CALIBRATION_CONTEXT cached
# ones, alternating, CALIBRATION_ROUNDS times (after one warm-up round); medians.
CALIBRATION_CONTEXT = 64
CALIBRATION_T = 9  # k = 8, the lookup default; larger k extrapolates the line through T = 2 and 9
CALIBRATION_ROUNDS = 5


@dataclass(frozen=True)
class CostModel:
    """What one speculative step costs, in plain decode steps of this model on this machine."""

    verify_fixed: float  # a verify pass over T tokens: 1 + verify_fixed + (T - 1) * verify_per_token
    verify_per_token: float
    step_ms: float | None = None  # the median plain step (T = 1) it was measured against
    draft_cost: float | None = None  # one draft token (a draft forward of T = 1), when a draft was measured
    measured: bool = True

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


DEFAULT_COSTS = CostModel(VERIFY_FIXED_COST, VERIFY_COST_PER_TOKEN, measured=False)
_MEASURED = WeakIdKeyDictionary()  # target model -> CostModel; (draft, target) below
_MEASURED_DRAFT = WeakIdKeyDictionary()  # draft model -> {target model -> draft token cost}
_MEASURE_LOCK = threading.Lock()


def _timed_forwards(model, sizes: list[int], rounds: int) -> dict[int, float]:
    """Median seconds of a forward of T tokens after CALIBRATION_CONTEXT cached ones, per T."""
    gen = torch.Generator().manual_seed(0)
    vocab = getattr(model, "vocab_size", 1000)
    context = torch.randint(0, vocab, (CALIBRATION_CONTEXT,), generator=gen).to(model.device)
    cache = model.new_cache(CALIBRATION_CONTEXT + max(sizes) + 1)
    model.forward(context, cache)
    times = {t: [] for t in sizes}
    for r in range(rounds + 1):  # round 0 warms up (first-call allocations, packing) and is dropped
        for t in sizes:
            cache.crop(CALIBRATION_CONTEXT)
            ids = torch.randint(0, vocab, (t,), generator=gen).to(model.device)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.forward(ids, cache, all_logits=t > 1)
            if model.device.type == "cuda":
                torch.cuda.synchronize()
            if r:
                times[t].append(time.perf_counter() - t0)
    return {t: statistics.median(ts) for t, ts in times.items()}


def measured_costs(model) -> CostModel:
    """The verify cost model of `model` on this machine: measured at its first use in this process
    (a few forwards, ~15 decode steps' time), then the same for every later request, so decisions
    stay a function of the tokens alone. Each model object (a quantized variant too) gets its own."""
    with _MEASURE_LOCK:
        costs = _MEASURED.get(model)
        if costs is None:
            m = _timed_forwards(model, [1, 2, CALIBRATION_T], CALIBRATION_ROUNDS)
            step = m[1]
            per_token = max(0.0, (m[CALIBRATION_T] - m[2]) / (CALIBRATION_T - 2) / step)
            fixed = max(0.0, m[2] / step - 1.0 - per_token)
            costs = _MEASURED[model] = CostModel(fixed, per_token, step_ms=step * 1e3)
        return costs


def measured_draft_cost(draft_model, target_model) -> float:
    """A draft token's cost in target decode steps: median draft step / median target step, both
    measured here once per process (decode is memory-bound, but at this size per-step overhead
    counts too: the weight ratio `matmul_weight_ratio` alone underestimates it)."""
    target = measured_costs(target_model)
    with _MEASURE_LOCK:
        per_target = _MEASURED_DRAFT.setdefault(draft_model, WeakIdKeyDictionary())
        cost = per_target.get(target_model)
        if cost is None:
            draft_step = _timed_forwards(draft_model, [1], CALIBRATION_ROUNDS)[1]
            cost = per_target[target_model] = draft_step * 1e3 / target.step_ms
        return cost


def matmul_weight_ratio(draft_model, target_model) -> float:
    """A draft token's cost relative to a target step, as the ratio of the weights their matmuls
    read (decode is memory-bound: a step costs about the bytes it reads). The bundled draft: ~0.09;
    measured time per token ~0.12 of a target step here."""
    def linear_bytes(m):
        return sum(mod.weight.numel() * mod.weight.element_size() for mod in m.modules()
                   if isinstance(mod, torch.nn.Linear))

    target = linear_bytes(target_model)
    return linear_bytes(draft_model) / target if target else 0.15


# --- the decoding ----------------------------------------------------------------------------
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
            prior, draft_cost = 0.5, 0.0
        elif config.speculative == "draft":
            if draft is None:
                raise InvalidRequest("speculative='draft' needs a draft model, and none is loaded: start the engine "
                                     "with --draft-model PATH (the bundled model has one built in)", "speculative")
            self.proposer = DraftModel(draft, capacity, model.vocab_size)
            prior = 0.4
            draft_cost = (measured_draft_cost(draft.model, model) if config.speculative_adaptive
                          else matmul_weight_ratio(draft.model, model))
            costs = CostModel(costs.verify_fixed, costs.verify_per_token, costs.step_ms, draft_cost, costs.measured)
        else:
            raise InvalidRequest(f"speculative={config.speculative!r} is not a speculative mode", "speculative")
        self.policy = AdaptiveK(config.num_speculative_tokens, adaptive=config.speculative_adaptive,
                                prior_acceptance=prior, draft_cost=draft_cost,
                                verify_fixed=costs.verify_fixed, verify_per_token=costs.verify_per_token)
        self.costs = costs
        self.drafted = self.accepted = self.steps = self.step_tokens = self.backoffs = 0
        self.accepted_hist = [0] * (config.num_speculative_tokens + 1)
        self.k_changes: list[dict] = []
        self.k_change_count = 0
        self.draft_ns = self.verify_ns = 0
        self._last_k = None

    def step(self) -> list[int]:
        room = min(self.config.max_new_tokens - len(self.output_ids) - 1,  # the bonus token always comes
                   self.model.max_context - len(self.ids) - 1)
        guesses, q, key = [], None, None
        if self.proposer.free_probe:  # look first (free), then decide how many of its guesses to check
            guesses, q = self._propose(self.config.num_speculative_tokens)
            key = self.proposer.matched_n
            if not guesses:  # nothing to guess from: no decision to make
                return self._plain_step()
        k = self.policy.choose(max(room, 0), self.proposer.free_probe, key)
        if not self.policy.probing:
            self._note_k(k)
        if self.proposer.free_probe:
            guesses = guesses[:k]
        elif k > 0:
            guesses, q = self._propose(k)
        if not guesses:
            return self._plain_step()
        return self._speculative_step(guesses, q, key)

    def _propose(self, k: int):
        """The proposer's guesses (up to k), timed as `draft_ms`."""
        t0 = time.perf_counter_ns()
        try:
            return self.proposer.propose(self.ids, k, self.sampler)
        finally:
            self.draft_ns += time.perf_counter_ns() - t0

    def _plain_step(self) -> list[int]:
        out = super().step()
        self.steps += 1
        self.step_tokens += 1
        if self.proposer.free_probe:  # would a guess have been right? (costs a dict lookup)
            guess, _ = self.proposer.propose(self.ids[:-1], 1, self.sampler)
            if guess:
                self.policy.observe(1, int(guess[0] == out[0]), self.proposer.matched_n)
        return out

    def _speculative_step(self, guesses: list[int], q, key=None) -> list[int]:
        k, before = len(guesses), len(self.ids)
        t0 = time.perf_counter_ns()
        logits = self.model.forward(self._tensor([self.ids[-1], *guesses]), self.cache, all_logits=True)
        self.forward_passes += 1
        new = verify_greedy(guesses, logits) if self.sampler.greedy else verify_sampling(guesses, q, logits, self.sampler)
        spent = time.perf_counter_ns() - t0
        self.verify_ns += spent
        accepted = len(new) - 1
        self.cache.crop(before + accepted)  # keep the last committed token and the accepted guesses
        self.proposer.after_verify(before, accepted)
        self.policy.observe(k, accepted, key)
        self.drafted += k
        self.accepted += accepted
        self.accepted_hist[accepted] += 1
        self.steps += 1
        self.step_tokens += len(new)
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
        }
