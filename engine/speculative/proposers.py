"""Proposers: guess the next tokens cheaply. `PromptLookup` copies what followed an earlier
occurrence of the last few tokens (no model); `DraftModel` runs a small LM with its own KV cache."""

from __future__ import annotations

import torch


class PromptLookup:
    """Propose the continuation of the latest earlier occurrence of the sequence's last n tokens.

    Tries n = max_ngram down to min_ngram. An index from each n-gram to the position after its
    latest occurrence is kept up to date as tokens arrive, so a proposal costs a few dict lookups.
    """

    name = "prompt_lookup"

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
    """Propose by running a small draft LM (`engine.speculative.draft.Draft`) k times; it keeps its own KV cache."""

    name = "draft"

    def __init__(self, draft, capacity: int, target_vocab: int):
        self.runner = draft.runner
        self.vocab = draft.vocab  # draft column -> target token id (None: identity)
        self.target_vocab = target_vocab
        self.cache = self.runner.new_cache(capacity)
        self.forward_passes = 0
        self._fed_back = 0  # guesses of the last proposal that went into the cache

    def _next(self, tokens: list[int], sampler) -> tuple[int, torch.Tensor | None]:
        ids = torch.tensor(tokens, dtype=torch.long, device=self.runner.device)
        logits = self.runner.forward(ids, self.cache)[0]
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
