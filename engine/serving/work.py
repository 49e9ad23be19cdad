"""The work a reply did, counted where it happens (the worker records it, engine/serving/worker.py):
the weight bytes, the prefill's FLOPs, the decode steps and the bytes they read. Counts only: the
machine's limits, and the fractions of them a reply reached, are the measuring tools' to stamp
(engine/measure/roofline.py, a publisher the entry point registers: engine/lab.py).

Prefill does the work of a few big matmuls, so its measure is FLOP:
    prefill FLOP = 2 × layer matmul parameters × prefill tokens      (every projection, every new token)
                 + 2 × lm_head parameters × 1                          (logits of the last position only)
                 + 4 × layers × heads × head_dim × Σ attended keys    (QKᵀ and A·V; token i of n, after
                                                                        c cached, attends to c + i keys)
Decode reads every weight once per step, plus the KV cache written so far:
    decode bytes = steps × step weight bytes + KV bytes per position × Σ context per step
    step weight bytes: every weight, but an embedding that is not also lm_head (a `+head` variant
    gives lm_head its own quantized copy) is read one row per token, not whole
    with Σ context = steps × (prompt tokens + output tokens / 2)      (exact for one token per step)
    KV bytes per position: the cache's own precision (the kv_cache_dtype toggle; int8's scales included:
    engine/model/kv_cache.py bytes_per_position, the one count)
`steps` are the target model's decode forward passes (a speculative step yields several tokens).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from engine.core.timeline import Timeline
from engine.model.kv_cache import bytes_per_position
from engine.model.loaded import weight_bytes

GATED_MLP = ("llama", "mistral", "qwen2", "qwen3", "gemma", "phi3")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    gated_mlp: bool = True

    @classmethod
    def of(cls, model) -> ModelShape:
        """From the model's transformers config (FastLlama and HFCausalLM both keep `.config`)."""
        c = model.config
        heads = c.num_attention_heads
        hidden = c.hidden_size
        return cls(layers=c.num_hidden_layers, heads=heads, kv_heads=getattr(c, "num_key_value_heads", None) or heads,
                   head_dim=getattr(c, "head_dim", None) or hidden // heads, hidden=hidden,
                   intermediate=getattr(c, "intermediate_size", None) or 4 * hidden, vocab=c.vocab_size,
                   gated_mlp=getattr(c, "model_type", "llama") in GATED_MLP)

    @property
    def layer_matmul_params(self) -> int:
        """Weights of every projection in the layers (q, k, v, o and the MLP), all layers."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return self.layers * (attn + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    def kv_bytes_per_token(self, dtype, kv: str = "model") -> int:
        """Bytes a position of context costs a decode step to read, in a cache of precision `kv` over a model
        of `dtype` (engine/model/kv_cache.py bytes_per_position)."""
        return bytes_per_position(kv, dtype, self.layers, self.kv_heads, self.head_dim)


def prefill_flops(shape: ModelShape, prefill_tokens: int, cached_tokens: int = 0) -> float:
    n, c = prefill_tokens, cached_tokens
    if n <= 0:
        return 0.0
    attended = n * c + n * (n + 1) // 2
    return (2.0 * shape.layer_matmul_params * n + 2.0 * shape.lm_head_params
            + 4.0 * shape.layers * shape.heads * shape.head_dim * attended)


_step_bytes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> step weight bytes


def step_weight_bytes(model: nn.Module) -> int:
    """Weight bytes one decode step reads (the module docstring's rule), counted once per model."""
    if model not in _step_bytes:
        total = weight_bytes(model)
        head = getattr(model, "lm_head", None)
        head_ptr = head.weight.untyped_storage().data_ptr() if isinstance(head, nn.Linear) else None
        for emb in (m for m in model.modules() if isinstance(m, nn.Embedding)):
            if emb.weight.untyped_storage().data_ptr() != head_ptr:
                total -= emb.weight.numel() * emb.weight.element_size() - emb.weight[0].numel() * emb.weight.element_size()
        _step_bytes[model] = total
    return _step_bytes[model]


def decode_bytes(weight_bytes: int, kv_bytes_per_token: int, steps: int, prompt_tokens: int,
                 output_tokens: int) -> float:
    if steps <= 0:
        return 0.0
    return steps * weight_bytes + kv_bytes_per_token * steps * (prompt_tokens + output_tokens / 2)


def prefill_passes(timeline: Timeline, chunked: bool, chunk_tokens: int) -> int:
    if not timeline.prefill_tokens:
        return 0
    return math.ceil(timeline.prefill_tokens / chunk_tokens) if chunked else 1


def record(timeline: Timeline, model, weight_bytes: int | None, dtype: str | None = None, config=None) -> None:
    """Fill the Timeline's counts of work once the reply is done (before its done event goes out); `dtype`:
    the matmul roof its prefill ran under (the worker's choice: the plan's, else the model's dtype)."""
    timeline.compute_dtype = dtype  # whatever the model: the publisher stamps that roof's peak
    try:
        shape = ModelShape.of(model)
    except AttributeError:  # a model without a transformers config: no FLOP count, say nothing
        return
    timeline.weight_bytes = weight_bytes
    kv = getattr(config, "kv_cache_dtype", "model")
    timeline.kv_cache_dtype = kv
    timeline.kv_bytes_per_position = shape.kv_bytes_per_token(getattr(model, "dtype", torch.float32), kv)
    timeline.prefill_flops = prefill_flops(shape, timeline.prefill_tokens or 0, timeline.cached_tokens or 0)
    passes = timeline.counters.forward_passes  # speculation's target_forward_passes is this count too
    if passes is not None and timeline.output_tokens > 1 and weight_bytes:
        chunked = bool(getattr(config, "chunked_prefill", False))
        steps = passes - prefill_passes(timeline, chunked, getattr(config, "prefill_chunk_tokens", 512) or 512)
        timeline.decode_steps = max(steps, 0)
        step = step_weight_bytes(model) if isinstance(model, nn.Module) else weight_bytes
        timeline.decode_bytes = decode_bytes(step, timeline.kv_bytes_per_position, timeline.decode_steps,
                                             timeline.prompt_tokens or 0, timeline.output_tokens)
