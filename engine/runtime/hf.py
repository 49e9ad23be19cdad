"""The transformers forward: the runner's way to run a model our Llama-family forward does not know
(engine/model/hf_model.py holds the module and its `DynamicCache`). Used for other architectures, with
`--no-fast-path`, and as the reference the fast path is tested against. One sequence at a time: the
scheduler does not batch such a model (engine/serving/scheduler.py `why_unbatched`)."""

from __future__ import annotations

import torch


@torch.inference_mode()
def forward(model, rows, caches, all_logits: bool = False) -> torch.Tensor:
    """The runner's `run` for an HFCausalLM: float32 logits, each sequence's last row ([B, vocab]) or,
    with all_logits, every row ([R, vocab])."""
    out = []
    for ids, cache in zip(rows, caches):
        ids = ids if isinstance(ids, torch.Tensor) else torch.tensor(list(ids), dtype=torch.long)
        ids = ids.to(device=model.device, dtype=torch.long)
        end = cache.length + ids.shape[0]
        if end > model.max_context:
            raise ValueError(f"position {end} is beyond the context window ({model.max_context})")
        result = model.model(input_ids=ids[None], cache=cache.inner, use_cache=True,
                             logits_to_keep=0 if all_logits else 1)
        cache.inner = result.cache if getattr(result, "cache", None) is not None else cache.inner
        out.append(result.logits[0].float())
    return out[0] if len(out) == 1 else torch.cat(out)
