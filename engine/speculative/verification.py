"""Verification: keep the output exactly the target's. Greedy accepts the longest prefix of the
guesses that equals the target's argmax; sampling is standard speculative sampling (Leviathan et
al. 2023, Chen et al. 2023), distributed exactly as the target's sampler would draw."""

from __future__ import annotations

import torch


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
