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
* When to guess, and how many: prompt lookup's `LookupPolicy` (lookup_policy.py) watches every
  proposal for free and verifies only when the tokens it expects beat the verify's cost; a draft
  model's `AdaptiveK` (policy.py) picks k from a decaying acceptance. Both price a verify with a
  `CostModel` (costs.py) measured on the loaded model once per process (by the idle worker, or by
  the first speculative request where that comes sooner) and then fixed for the process (so that the same seed gives the same reply); the Timeline records each change
  of k (`k_changes`).

Public interface (what serving imports): `Speculation` (one request's proposer, policy, counters and
replay log: it proposes, the decode loop has the runner verify, it judges the logits), `calibrate_idle`
and `load_draft`. Speculation never imports serving. Modules: speculation, proposers, verification,
costs, lookup_policy, policy, replay; draft (loading the draft model), draft_prompts (the prompts the
bundled draft was distilled on; engine/bench/draft_train.py distils it).
"""

from engine.speculative.costs import (
    DEFAULT_COSTS,
    CostModel,
    calibrate_idle,
    matmul_weight_ratio,
    measured_costs,
    measured_draft_cost,
)
from engine.speculative.draft import Draft, load_draft
from engine.speculative.lookup_policy import LookupPolicy
from engine.speculative.policy import AdaptiveK
from engine.speculative.proposers import DraftModel, PromptLookup
from engine.speculative.speculation import Proposal, Speculation
from engine.speculative.verification import verify_greedy, verify_sampling

__all__ = ["AdaptiveK", "CostModel", "DEFAULT_COSTS", "Draft", "DraftModel", "LookupPolicy", "PromptLookup", "Proposal",
           "Speculation", "calibrate_idle", "load_draft", "matmul_weight_ratio", "measured_costs", "measured_draft_cost",
           "verify_greedy", "verify_sampling"]
