"""Turning logits into a token: greedy, or temperature / top-k / top-p sampling with a seed.

`probs` exposes the exact distribution a token is drawn from, because speculative sampling
must compare the target's and the draft's distributions after the same processing.
"""

from __future__ import annotations

import secrets

import torch

from .config import GenerationConfig

MIN_TEMPERATURE = 1e-5


class Sampler:
    def __init__(self, config: GenerationConfig, device: torch.device | str = "cpu"):
        # Below MIN_TEMPERATURE, logits / T overflows float32 (1e-50 is 0 there, and 0/0 is NaN); the
        # limit of sampling as T -> 0 is greedy, so such temperatures are greedy.
        self.temperature = float(config.temperature) if config.temperature >= MIN_TEMPERATURE else 0.0
        self.top_k = int(config.top_k)
        self.top_p = float(config.top_p)
        self.seed = config.seed if config.seed is not None else secrets.randbits(63)
        # Sampling draws on the CPU: the same seed gives the same tokens on any device.
        self.generator = torch.Generator("cpu").manual_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution (float32, rows sum to 1) a token is drawn from, for each row of logits."""
        logits = logits.float()
        if self.greedy:
            out = torch.zeros_like(logits)
            out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
            return out
        logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            # drop a token when the tokens ranked above it already reach top_p (the first is kept)
            drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= self.top_p
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits.softmax(-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token id from a 1-D distribution, using this request's generator."""
        return int(torch.multinomial(probs.cpu(), 1, generator=self.generator).item())

    def sample(self, logits: torch.Tensor) -> int:
        """One token id from logits of shape [vocab] or [1, vocab]."""
        row = logits.reshape(-1, logits.shape[-1])[-1]
        if self.greedy:
            return int(row.argmax().item())
        return self.draw(self.probs(row))

    def uniform(self) -> float:
        """A uniform draw in [0, 1) from this request's generator (speculative acceptance)."""
        return float(torch.rand(1, generator=self.generator).item())
