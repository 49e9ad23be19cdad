"""The sampler's fast top-p and draw against their plain definitions (engine/serving/sampling.py)."""

import pytest
import torch

from engine.core.config import GenerationConfig
from engine.serving import sampling, sampling_cpu
from engine.serving.sampling import Sampler


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


# --- the CPU path (engine/serving/sampling_cpu.py, numpy) against the torch one, and the definitions ---------------
@pytest.mark.parametrize("spread", [8.0, 3.0, 0.05])  # the first threshold, the second, and all tokens
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_cpu_nucleus_is_the_nucleus_of_a_full_sort(spread, top_p):
    gen = torch.Generator().manual_seed(int(spread * 100 + top_p * 10) + 1)
    logits = torch.randn(3, 49152, generator=gen) * spread
    want = _nucleus_by_full_sort(logits, top_p)
    ranked, order = torch.sort(logits, dim=-1, descending=True)
    p = ranked.softmax(-1)
    above = torch.empty_like(p).scatter_(-1, order, p.cumsum(-1) - p)
    for row in range(3):
        got = torch.zeros(49152, dtype=torch.bool)
        got[torch.from_numpy(sampling_cpu.nucleus(logits[row].numpy(), top_p))] = True
        # Only boundary tokens may differ: their higher-ranked mass is top_p within float rounding. A 0.99
        # nucleus of ~12k tokens has several such (4 under qemu's Haswell, AVX2: other reduction widths).
        differs = got != want[row]
        assert int(differs.sum()) <= 8 and bool(((above[row][differs] - top_p).abs() < 1e-5).all())


CONFIGS = [dict(temperature=0.7, top_p=0.9), dict(temperature=1.0), dict(temperature=1.3, top_k=40),
           dict(temperature=0.8, top_k=50, top_p=0.95), dict(temperature=0.0)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_cpu_probs_are_the_torch_path_s_distribution(cfg):
    sampler = Sampler(GenerationConfig(**cfg, seed=3))
    logits = torch.randn(4, 49152, generator=torch.Generator().manual_seed(7)) * 3  # a verify step's rows
    cpu, reference = sampler.probs(logits), sampler.probs_torch(logits)
    assert cpu.shape == reference.shape and cpu.dtype == torch.float32
    assert torch.allclose(cpu, reference, atol=1e-6, rtol=1e-4)
    assert torch.equal(cpu > 0, reference > 0)  # the same tokens can be drawn
    assert torch.allclose(cpu.sum(-1), torch.ones(4))


def test_cpu_sample_matches_greedy_ties_and_seeded_draws():
    greedy = Sampler(GenerationConfig(temperature=0.0))
    tied = torch.zeros(49152)
    tied[[17, 400, 9000]] = 5.0
    assert greedy.sample(tied) == int(tied.argmax()) == 17  # the first of equal maxima
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(1)) * 3
    a = Sampler(GenerationConfig(temperature=0.7, top_p=0.9, seed=21))
    b = Sampler(GenerationConfig(temperature=0.7, top_p=0.9, seed=21))
    draws = [a.sample(logits) for _ in range(50)]
    assert draws == [b.draw(b.probs_torch(logits)) for _ in range(50)]  # the same stream, the same tokens
    assert len(set(draws)) > 1
