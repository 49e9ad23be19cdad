"""The generic path: any transformers causal LM through its own forward and `DynamicCache`.

It offers the same small interface as `FastLlama` (new_cache / max_context / vocab_size / device /
dtype); the runner runs it through engine/runtime/hf.py, so the decode loop does not care which one
it drives. Used for architectures the fast path does not know, and as the reference the fast path
is tested against.
"""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache


class HFCache:
    """`DynamicCache` behind the KVCache interface (length, crop, copy_prefix, nbytes)."""

    def __init__(self, config):
        self.inner = DynamicCache(config=config)
        self._config = config

    @property
    def length(self) -> int:
        return self.inner.get_seq_length()

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        if length == 0:
            self.inner = DynamicCache(config=self._config)
        elif length < self.length:
            self.inner.crop(length - self.length)  # transformers 5 takes minus the tokens to drop

    def copy_prefix(self, length: int | None = None, capacity: int | None = None) -> HFCache:
        out = copy.copy(self)
        out.inner = copy.deepcopy(self.inner)
        if length is not None:
            out.crop(length)
        return out

    def nbytes(self, positions: int | None = None) -> int:
        total, n = 0, self.length
        for layer in getattr(self.inner, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None:
                    total += t.numel() * t.element_size()
        if positions is None or n == 0:
            return total
        return total * positions // n

    def allocated_bytes(self) -> int:
        return self.nbytes()

    def ensure_capacity(self, needed: int) -> None:  # grows by itself
        pass


class HFCausalLM(torch.nn.Module):
    def __init__(self, hf_model):
        super().__init__()
        self.model = hf_model
        self.config = hf_model.config
        self.max_context = int(
            getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", 2048)
        )
        self.vocab_size = hf_model.get_output_embeddings().out_features

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def new_cache(self, capacity: int) -> HFCache:
        return HFCache(self.config)
