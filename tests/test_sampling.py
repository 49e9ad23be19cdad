"""The sampler's fast top-p and draw against their plain definitions (engine/sampling.py)."""

import pytest
import torch

from engine import sampling
from engine.config import GenerationConfig
from engine.sampling import Sampler


def _nucleus_by_full_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition: sort every token, keep those whose higher-ranked tokens sum below top_p."""
    ranked, order = torch.sort(logits, dim=-1, descending=True)
    p = ranked.softmax(-1)
    keep_ranked = (p.cumsum(-1) - p) < top_p
    return torch.zeros_like(keep_ranked).scatter(-1, order, keep_ranked)


@pytest.mark.parametrize("spread", [8.0, 3.0, 0.05])  # peaked, chat-like, nearly flat (past the candidates)
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_keeps_exactly_the_nucleus_of_a_full_sort(spread, top_p):
    gen = torch.Generator().manual_seed(int(spread * 100 + top_p * 10))
    logits = torch.randn(4, 49152, generator=gen) * spread
    fast = sampling._nucleus(logits, top_p)
    want = _nucleus_by_full_sort(logits, top_p)
    # Equal, but for a token whose higher-ranked mass is top_p within float rounding (the candidates'
    # softmax sums in another order than the sorted one): both keep or drop it by that rounding.
    ranked, order = torch.sort(logits, dim=-1, descending=True)
    p = ranked.softmax(-1)
    above = torch.empty_like(p).scatter_(-1, order, p.cumsum(-1) - p)
    differs = fast != want
    assert bool(((above[differs] - top_p).abs() < 1e-5).all())
    assert int(differs.sum()) <= 2
    kept = int(fast[0].sum())
    if spread == 0.05:  # the case that needs the full sort: more than the candidates are kept
        assert kept > sampling.NUCLEUS_CANDIDATES
    if spread == 8.0:
        assert kept < sampling.NUCLEUS_CANDIDATES


def test_draw_follows_the_distribution_and_never_draws_a_zero():
    probs = torch.zeros(1000)
    probs[[3, 500, 999]] = torch.tensor([0.2, 0.5, 0.3])
    sampler = Sampler(GenerationConfig(temperature=1.0, seed=5))
    draws = torch.tensor([sampler.draw(probs) for _ in range(4000)])
    assert set(draws.tolist()) <= {3, 500, 999}
    freq = [(draws == i).float().mean().item() for i in (3, 500, 999)]
    assert freq == pytest.approx([0.2, 0.5, 0.3], abs=0.03)  # ~4.5 standard deviations of 4,000 draws


def test_draw_is_reproducible_per_seed_and_refuses_a_distribution_with_no_mass():
    probs = torch.rand(49152).softmax(-1)
    a = Sampler(GenerationConfig(temperature=1.0, seed=11))
    b = Sampler(GenerationConfig(temperature=1.0, seed=11))
    assert [a.draw(probs) for _ in range(20)] == [b.draw(probs) for _ in range(20)]
    with pytest.raises(ValueError, match="no mass"):
        a.draw(torch.zeros(10))
    with pytest.raises(ValueError, match="no mass"):
        a.draw(torch.full((10,), float("nan")))
