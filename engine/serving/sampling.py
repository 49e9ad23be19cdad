"""Turning logits into a token: greedy, or temperature / top-k / top-p sampling with a seed.

`probs` exposes the exact distribution a token is drawn from, because speculative sampling
must compare the target's and the draft's distributions after the same processing.

CPU logits go through numpy (engine/serving/sampling_cpu.py), other devices through torch ops (below); a
test holds the two to the same distribution. Why: each torch op over a 49,152-token row is an
OpenMP parallel region, and in a busy server (the HTTP thread and the clients on the same cores)
their hand-offs cost the model thread time between the batch's forwards, every token (seen in
`python -m server.bench load`; figures in docs/history.md, 2026-12-02).
"""

from __future__ import annotations

import secrets

import torch

from engine.core.config import GenerationConfig
from engine.serving import sampling_cpu

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
        if logits.device.type == "cpu":
            return torch.from_numpy(sampling_cpu.probs(self, logits.detach().float().numpy()))
        return self.probs_torch(logits)

    def probs_torch(self, logits: torch.Tensor) -> torch.Tensor:
        """`probs` in torch ops, for logits on any device."""
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
            logits = logits.masked_fill(~_nucleus(logits, self.top_p), float("-inf"))
        return logits.softmax(-1)

    def draw(self, probs: torch.Tensor) -> int:
        """One token id from a 1-D distribution, using this request's generator: the inverse of its
        cumulative sum at a uniform draw (float64, so 49k small terms keep their mass). A token of
        probability 0 is never drawn. Why not torch.multinomial: over SmolLM2's 49,152 tokens it cost
        many times this draw (docs/history.md, 2026-12-02), and a batch of 8 draws every step."""
        return sampling_cpu.draw(probs.detach().reshape(-1).cpu().numpy(), self.uniform64)

    def uniform64(self) -> float:
        """A float64 uniform draw in [0, 1) from this request's generator (what `draw` inverts)."""
        return float(torch.rand(1, generator=self.generator, dtype=torch.float64))

    def sample(self, logits: torch.Tensor) -> int:
        """One token id from logits of shape [vocab] or [1, vocab]."""
        row = logits.reshape(-1, logits.shape[-1])[-1]
        if self.greedy:  # on CPU through numpy (the first of equal maxima, as torch.argmax)
            return int(row.detach().float().numpy().argmax()) if row.device.type == "cpu" else int(row.argmax().item())
        return self.draw(self.probs(row))  # probs and draw take the CPU path themselves

    def uniform(self) -> float:
        """A uniform draw in [0, 1) from this request's generator (speculative acceptance)."""
        return float(torch.rand(1, generator=self.generator).item())


NUCLEUS_CANDIDATES = 256  # top-p looks among this many top-ranked tokens first


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens top-p keeps, per row of logits: the top-ranked ones whose higher-ranked tokens
    sum to less than `top_p` (the first is always kept). Exact: it ranks only the
    NUCLEUS_CANDIDATES most likely tokens, and sorts the whole row only where the nucleus might
    reach past them. Why: a full sort of 49,152 logits costs far more than the candidates' top-k
    (docs/history.md, 2026-12-02); with 0.7 < T the nucleus of a chat model is far smaller."""
    k = min(NUCLEUS_CANDIDATES, logits.shape[-1])
    top, order = torch.topk(logits.softmax(-1), k, dim=-1)
    if k < logits.shape[-1] and bool(((top.cumsum(-1) - top) < top_p)[..., -1].any()):
        ranked, order = torch.sort(logits, dim=-1, descending=True)  # the nucleus may reach past them
        top = ranked.softmax(-1)
    keep_ranked = (top.cumsum(-1) - top) < top_p
    return torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, keep_ranked)
