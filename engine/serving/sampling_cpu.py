"""The sampler's arithmetic for CPU logits, in numpy: the same distribution as Sampler.probs_torch
(greedy one-hot, temperature, top-k, top-p, softmax) and the same draw (the inverse of a float64
cumulative sum at a uniform from the request's generator), with no OpenMP hand-off per step.
engine/serving/sampling.py says why; tests/test_sampling.py holds the two paths to each other.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

# Top-p first looks among the tokens within this factor of the most likely one, then within its
# square, then at all: a set of every token above a threshold is the top of the ranking, and once it
# holds top_p of the mass (with a margin for float rounding) the nucleus lies inside it.
NUCLEUS_THRESHOLDS = (1e-4, 1e-8, 0.0)
MASS_MARGIN = 1e-5


def softmax(z: np.ndarray) -> np.ndarray:
    """Rows of z (float32, -inf allowed) to probabilities."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def nucleus(z: np.ndarray, top_p: float) -> np.ndarray:
    """Top-p over one row of logits z: the indices of the top-ranked tokens whose higher-ranked
    tokens sum to less than top_p (the first is always kept). Ranks only the tokens above a
    threshold, which the nucleus cannot leave (NUCLEUS_THRESHOLDS)."""
    p = softmax(z)
    top = p.max()
    for t in NUCLEUS_THRESHOLDS:
        idx = np.flatnonzero(p >= top * t)
        if t == 0.0 or p[idx].sum(dtype=np.float64) >= top_p + MASS_MARGIN:
            break
    order = idx[np.argsort(-p[idx], kind="stable")]
    ranked = p[order]
    return order[(np.cumsum(ranked) - ranked) < top_p]


def kept(sampler, z: np.ndarray) -> np.ndarray | None:
    """The tokens top-k and top-p keep in one row of temperature-scaled logits (None: all)."""
    idx = None
    if sampler.top_k and sampler.top_k < z.shape[-1]:
        kth = np.partition(z, z.shape[-1] - sampler.top_k)[z.shape[-1] - sampler.top_k]
        idx = np.flatnonzero(z >= kth)  # ties with the k-th stay, as in the torch path
    if sampler.top_p < 1.0:
        inner = nucleus(z if idx is None else z[idx], sampler.top_p)
        idx = inner if idx is None else idx[inner]
    return idx


def probs(sampler, logits: np.ndarray) -> np.ndarray:
    """Sampler.probs for CPU logits [..., vocab]: float32, each row sums to 1, zero outside what
    top-k and top-p keep (their softmax is over the kept tokens alone: the same distribution)."""
    z = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1, logits.shape[-1])
    out = np.zeros_like(z)
    if sampler.greedy:
        out[np.arange(len(z)), z.argmax(axis=-1)] = 1.0
        return out.reshape(logits.shape)
    for row, dest in zip(z / np.float32(sampler.temperature), out):
        idx = kept(sampler, row)
        if idx is None:
            dest[:] = softmax(row)
        else:
            dest[idx] = softmax(row[idx])
    return out.reshape(logits.shape)


def draw(p: np.ndarray, uniform: Callable[[], float]) -> int:
    """One token id from a 1-D distribution: the inverse of its float64 cumulative sum at a uniform
    draw. Only tokens with mass enter the sum (a zero never moves it: the same cdf, and a token of
    probability 0 is never drawn); a top-p row has a handful."""
    idx = np.flatnonzero(p != 0)  # a mask first: nonzero on floats is much slower (docs/history.md)
    cdf = np.cumsum(p[idx], dtype=np.float64)
    if not len(cdf) or not cdf[-1] > 0:  # all zero, or NaN: no token can be drawn from it
        raise ValueError("cannot sample from a distribution with no mass (all zero or NaN)")
    return int(idx[min(np.searchsorted(cdf, uniform() * cdf[-1], side="right"), len(cdf) - 1)])

