"""The draft model that speculative decoding guesses with: the bundled one, or any causal LM folder.

A draft must share the target's tokenizer (its token ids mean the same tokens). It runs through a
runner of its own (engine/runtime/runner.py, with its own execution plan), in the target's dtype
and on its device, with a KV cache of its own per request.

The bundled draft for SmolLM2-135M-Instruct (engine/assets/draft-smollm2-135m, made by
`python -m engine.bench.draft_train`) ships only what it does not share with the target: a few
transformer layers and a final norm, plus the list of target token ids its output head covers.
Its token embeddings are the target's own tensor, and its head is the target's head restricted
to those rows (q = 0 for every other token, which verification handles exactly).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.core.errors import LoadError
from engine.model.loaded import build_model
from engine.runtime.plan import make_plan
from engine.runtime.runner import Runner, open_runner

# engine/assets/: package data (pyproject.toml), so an installed engine finds it too
BUNDLED_DRAFT_DIR = Path(__file__).resolve().parents[1] / "assets" / "draft-smollm2-135m"
WEIGHTS_FILE = "draft.safetensors"


@dataclass
class Draft:
    """A loaded draft: its runner, and the target token id of each of its output columns."""

    runner: Runner  # over FastLlama or HFCausalLM with the draft's weights
    name: str
    path: str
    vocab: torch.Tensor | None = None  # [draft columns] target ids; None: the draft's column i is token i
    notes: str = ""

    @property
    def model(self) -> nn.Module:
        return self.runner.model

    def info(self) -> dict:
        columns = self.model.vocab_size if self.vocab is None else int(self.vocab.numel())
        return {"name": self.name, "path": self.path, "layers": len(getattr(self.model, "blocks", []) or []),
                "head_columns": columns, "notes": self.notes}


def build_draft_hf(target_config, embed: nn.Embedding, head_weight: torch.Tensor, layers: int,
                   vocab_ids: torch.Tensor | None, dtype: torch.dtype):
    """A Llama with `layers` fresh layers that shares the target's embeddings and (rows of) its head.

    Used both to train the bundled draft and to load it. Only `model.layers.*` and `model.norm`
    are the draft's own parameters; the embedding module is the target's (same tensor).
    """
    from transformers import AutoModelForCausalLM

    cfg = target_config.__class__.from_dict(target_config.to_dict())
    cfg.num_hidden_layers = layers
    cfg.vocab_size, cfg.pad_token_id = 1, None  # embeddings and head come from the target: allocate none
    cfg.tie_word_embeddings = False
    draft = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    draft.config.vocab_size, draft.config.pad_token_id = target_config.vocab_size, target_config.pad_token_id
    draft.model.embed_tokens = embed
    rows = head_weight if vocab_ids is None else head_weight[vocab_ids.to(head_weight.device)]
    draft.lm_head = nn.Linear(rows.shape[1], rows.shape[0], bias=False, dtype=rows.dtype, device=rows.device)
    draft.lm_head.weight = nn.Parameter(rows if vocab_ids is None else rows.detach().clone(), requires_grad=False)
    return draft.to(device=head_weight.device)


def own_state_dict(draft_hf) -> dict[str, torch.Tensor]:
    """The draft's own weights: its layers and final norm (what ships in assets/)."""
    return {k: v for k, v in draft_hf.state_dict().items() if k.startswith(("model.layers.", "model.norm."))}


def bundled_draft(target) -> Draft:
    """The draft shipped in assets/ for the bundled model, sharing its embeddings and head rows."""
    from safetensors.torch import load_file

    meta = json.loads((BUNDLED_DRAFT_DIR / "draft.json").read_text())
    weights = load_file(str(BUNDLED_DRAFT_DIR / WEIGHTS_FILE))
    vocab = weights.pop("vocab_ids").long()
    module = target.model
    if hasattr(module, "embed"):  # FastLlama
        config, embed, head = module.config, module.embed, module.lm_head.weight
    else:  # HFCausalLM
        config, embed = module.config, module.model.get_input_embeddings()
        head = module.model.get_output_embeddings().weight
    draft_hf = build_draft_hf(config, embed, head, meta["layers"], vocab, target.dtype)
    missing, unexpected = draft_hf.load_state_dict({k: v.to(target.dtype) for k, v in weights.items()}, strict=False)
    own_missing = [k for k in missing if k.startswith(("model.layers.", "model.norm."))]
    if own_missing or unexpected:
        raise LoadError(f"the bundled draft in {BUNDLED_DRAFT_DIR} does not match its config "
                        f"(missing {own_missing[:3]}, unexpected {unexpected[:3]}); rerun python -m engine.bench.draft_train")
    draft_hf.to(target.device).eval()
    draft_model, _, _ = build_model(draft_hf, target.fast_path)
    runner = Runner(draft_model, make_plan(draft_model, target.device, cache_dir=target.cache_dir, weights="draft"))
    runner.warm_up()
    return Draft(runner, name=meta.get("name", "bundled draft"), path=str(BUNDLED_DRAFT_DIR),
                 vocab=vocab.to(target.device),
                 notes=f"{meta['layers']} layers distilled from the target; head over {vocab.numel():,} tokens")


def load_draft(spec: str | None, target) -> Draft | None:
    """The draft for a loaded target (`engine.model.loaded.LoadedModel`).

    `spec` None: the bundled draft when the target is the bundled model, else no draft.
    Otherwise a model folder (or .gguf file) that shares the target's tokenizer.
    """
    if spec is None:
        if target.source != "bundled" or not (BUNDLED_DRAFT_DIR / WEIGHTS_FILE).is_file():
            return None
        return bundled_draft(target)
    if spec == "none":
        return None
    return _load_folder(spec, target)


def _load_folder(spec: str, target) -> Draft:
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    cfg = LoadConfig(model=spec, dtype=target.dtype_name, device=str(target.device.type),
                     fast_path=target.fast_path, progress=False)
    try:
        loaded = load(cfg)
    except LoadError as exc:
        raise LoadError(f"--draft-model: {exc}") from exc
    if loaded.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise LoadError(f"--draft-model {spec}: its tokenizer differs from the target's, so its token ids "
                        "mean other tokens; a draft must share the target's tokenizer")
    vocab = None
    if loaded.model.vocab_size != target.model.vocab_size:  # padded (or short) vocab: use the common ids
        vocab = torch.arange(min(loaded.model.vocab_size, target.model.vocab_size), device=target.device)
    return Draft(open_runner(loaded, weights="draft"), name=loaded.name, path=str(spec), vocab=vocab)
