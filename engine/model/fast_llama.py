"""Our own forward pass for Llama-family models (Llama, SmolLM, Mistral without sliding window, Qwen2).

Why not the transformers forward: at this model size a decode step is a few milliseconds of
matmuls, and the generic forward adds Python work around them (mask building, cache classes,
per-projection calls). This module keeps the weights transformers loaded, fuses the q/k/v and
gate/up projections into one matmul each, writes keys and values straight into a preallocated
`KVCache`, and returns logits only for the positions asked for. Measured against the same
model's `generate` by `python -m engine.bench baseline` (README).

Every projection is an `nn.Linear` module, so quantization (quantize.py) can swap it for a
quantized module and the forward keeps working unchanged. This module holds weights and shapes only:
which kernel runs each projection is decided in one place (engine/runtime/plan.py), and the forward
is the runner's (engine/runtime/runner.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def unsupported_reason(hf_model) -> str | None:
    """Why `hf_model` cannot use this fast path (None when it can)."""
    cfg = hf_model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {cfg.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention is not implemented in the fast path"
    if not hasattr(hf_model, "model") or not hasattr(hf_model.model, "rotary_emb"):
        return "the model has no rotary embedding module where a Llama-family model keeps it"
    return None


def _fuse(*linears: nn.Linear) -> nn.Linear:
    """One Linear whose output is the concatenation of the given Linears' outputs."""
    weight = torch.cat([lin.weight for lin in linears])
    has_bias = [lin.bias is not None for lin in linears]
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=any(has_bias), device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if any(has_bias):
        fused.bias = nn.Parameter(
            torch.cat([lin.bias if lin.bias is not None else weight.new_zeros(lin.out_features) for lin in linears]),
            requires_grad=False,
        )
    return fused


class RMSNorm(nn.Module):
    """The Llama RMSNorm, computed in float32 exactly as transformers does."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x):
        if x.dtype == torch.float32:  # one fused call, bit for bit the lines below in fp32 (tested)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Block(nn.Module):
    def __init__(self, hf_layer, eps: float):
        super().__init__()
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.attn_norm = RMSNorm(hf_layer.input_layernorm.weight, eps)
        self.qkv = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = attn.o_proj
        self.mlp_norm = RMSNorm(hf_layer.post_attention_layernorm.weight, eps)
        self.gate_up = _fuse(mlp.gate_proj, mlp.up_proj)
        self.down = mlp.down_proj
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.scaling = attn.scaling


class FastLlama(nn.Module):
    """A Llama-family causal LM's weights, fused projections and rotary tables, and its KV cache's
    shape. The runner (engine/runtime/runner.py) runs it, one sequence or several in one forward."""

    def __init__(self, hf_model):
        super().__init__()
        reason = unsupported_reason(hf_model)
        if reason:
            raise ValueError(reason)
        cfg = hf_model.config
        base = hf_model.model
        self.config = cfg
        self.embed = base.embed_tokens
        self.blocks = nn.ModuleList(Block(layer, cfg.rms_norm_eps) for layer in base.layers)
        self.norm = RMSNorm(base.norm.weight, cfg.rms_norm_eps)
        self.lm_head = hf_model.lm_head
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = self.blocks[0].q_size // self.n_heads
        self.max_context = int(getattr(cfg, "max_position_embeddings", 2048))
        self.vocab_size = self.lm_head.out_features
        rotary = base.rotary_emb
        # cos/sin for every position, float32 like transformers' rotary module, cast once.
        positions = torch.arange(self.max_context, dtype=torch.float32, device=rotary.inv_freq.device)
        freqs = torch.outer(positions, rotary.inv_freq.float())
        emb = torch.cat([freqs, freqs], dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        dtype = self.embed.weight.dtype
        self.register_buffer("cos", (emb.cos() * scale).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * scale).to(dtype), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def new_cache(self, capacity: int, kind: str = "model") -> KVCache:
        """`kind`: the cache's precision (engine/model/kv_cache.py; the kv_cache_dtype toggle)."""
        return KVCache(len(self.blocks), self.n_kv_heads, self.head_dim, capacity, self.dtype, self.device, kind)
