"""A loaded model as the engine holds it (`LoadedModel`), and what every builder of one shares:
the dtype names, weight accounting, the module choice (our FastLlama or the generic transformers
one) and the one-line error text. The loader, the quantized variants and the draft
model all build on this module; it imports none of them."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.core.errors import first_line  # noqa: F401 (re-exported)
from engine.kernels.catalogue import packed_bytes

DTYPE_NAMES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class LoadedModel:
    """What the engine needs to run requests, and what the page shows about the model."""

    model: torch.nn.Module  # FastLlama or HFCausalLM: new_cache(), forward(), max_context
    tokenizer: object
    name: str
    source: str  # bundled | gguf | folder | hub
    path: str
    dtype: torch.dtype
    device: torch.device
    load_s: float
    fast_path: bool
    weights: str = ""  # the folder (or hub id) transformers read the weights from
    eos_token_ids: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    draft: object | None = None  # engine.speculative.draft.Draft for speculative='draft' (None: no draft loaded)
    cache_dir: object | None = None  # a Path: where measured kernel decisions are kept (None: not kept)
    device_reason: str | None = None  # why this device serves (engine/platform/device.py), e.g. 'cpu: --device cpu asked for'

    @property
    def max_context(self) -> int:
        return self.model.max_context

    @property
    def dtype_name(self) -> str:
        return {v: k for k, v in DTYPE_NAMES.items()}.get(self.dtype, str(self.dtype))

    def weight_bytes(self) -> int:
        return weight_bytes(self.model)

    def info(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "dtype": self.dtype_name,
            "device": str(self.device),
            "device_reason": self.device_reason,
            "load_s": round(self.load_s, 3),
            "fast_path": self.fast_path,
            "weight_bytes": self.weight_bytes(),
            "max_context": self.max_context,
            "threads": torch.get_num_threads(),
            "notes": list(self.notes),
            "draft": self.draft.info() if self.draft is not None else None,
            "packed_weight_mb": round(packed_bytes() / 1e6, 1),  # oneDNN copies for multi-row matmuls
        }


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of real storage behind a module's parameters and persistent buffers, each storage
    counted once (tied embeddings are one tensor; quantized layers count their packed storage).
    Non-persistent buffers (rotary tables) are derived, not weights, and are left out."""
    tensors = list(module.parameters())
    for mod in module.modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        tensors += [b for name, b in mod.named_buffers(recurse=False) if name not in skip]
        tensors += quant_state_tensors(mod)  # bitsandbytes keeps scales outside params/buffers
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def quant_state_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Tensors a bitsandbytes layer keeps outside its parameters and buffers (row scales,
    block absmax, code books), so weight accounting can count them (weight_bytes)."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:
        return []
    found = []
    if isinstance(module, bnb.nn.Linear8bitLt):
        found = [module.state.CB, module.state.SCB, getattr(module.weight, "SCB", None)]
    elif isinstance(module, bnb.nn.Linear4bit):
        qs = getattr(module.weight, "quant_state", None)
        if qs is not None:
            state2 = getattr(qs, "state2", None) if getattr(qs, "nested", False) else None
            found = [qs.absmax, qs.code, getattr(qs, "offset", None)]
            if state2 is not None:
                found += [state2.absmax, state2.code]
    return [t for t in found if isinstance(t, torch.Tensor)]


def build_model(hf_model, fast_path: bool):
    """The module the runner runs: our FastLlama where it supports the model (and `fast_path`), else
    the transformers module (HFCausalLM). Returns (module, fast, why not fast)."""
    from engine.model.fast_llama import FastLlama, unsupported_reason
    from engine.model.hf_model import HFCausalLM

    why = "disabled by --no-fast-path" if not fast_path else unsupported_reason(hf_model)
    if why:
        return HFCausalLM(hf_model), False, why
    return FastLlama(hf_model), True, None
