"""How close a model variant's next-token distributions stay to a reference model's.

A fixed set of short chat exchanges (question and answer, rendered with the chat template) is
run through both models with teacher forcing. Over the last `POSITIONS` positions of each — the
answer, where the model does its work — we compare the next-token distributions:

  top1_agreement  share of positions where both models rank the same token first
  mean_kl         mean KL(reference || variant) in nats: how much probability mass moved
  perplexity      exp of the mean negative log-likelihood the variant gives the exchange's actual
                  next tokens (beside `reference_perplexity`, the reference model's own)

Greedy decoding follows top-1, so agreement predicts how long greedy outputs stay identical;
KL also sees the changes below the top token that sampling would feel.
"""

from __future__ import annotations

import torch

POSITIONS = 64

QUALITY_SET = [
    ("Why is the sky blue?",
     "Sunlight contains every color of visible light. When it enters the atmosphere, it collides with "
     "nitrogen and oxygen molecules, which scatter short wavelengths much more strongly than long ones. "
     "Blue light is scattered in every direction across the whole sky, so wherever you look away from "
     "the sun, some of that scattered blue light reaches your eyes. At sunset the light crosses far more "
     "air, the blue is scattered away before it arrives, and the reds and oranges remain."),
    ("Write a Python function that returns the n-th Fibonacci number.",
     "Here is an iterative version that runs in linear time and constant memory:\n\n```python\n"
     "def fibonacci(n: int) -> int:\n    if n < 0:\n        raise ValueError(\"n must be non-negative\")\n"
     "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```\n\n"
     "For example, fibonacci(10) returns 55. A recursive version is shorter but takes exponential time "
     "unless you cache its results."),
    ("Give me three tips for a good night's sleep.",
     "1. Keep a regular schedule: go to bed and wake up at the same time every day, even at weekends, so "
     "your body clock knows when to feel tired.\n2. Make the bedroom dark, quiet and cool, and keep "
     "phones and laptops out of it for the last hour before bed.\n3. Avoid caffeine after lunch and heavy "
     "meals late in the evening; a short walk during the day helps you fall asleep faster at night."),
    ("Summarize the causes of the French Revolution.",
     "The French Revolution of 1789 had several causes that reinforced each other. The monarchy was "
     "deeply in debt after costly wars, including support for the American Revolution, and its tax "
     "system spared the nobility and clergy while burdening ordinary people. Poor harvests drove up the "
     "price of bread. Enlightenment ideas about rights and popular sovereignty spread among the middle "
     "classes, who resented their lack of political power, and the king's attempts at reform failed."),
]


def quality_inputs(tokenizer, texts: int | None = None) -> list[list[int]]:
    """Token ids of the fixed exchanges (the first `texts` of them), each longer than POSITIONS."""
    out = []
    for question, answer in QUALITY_SET[:texts]:
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(messages, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(f"user: {question}\nassistant: {answer}")["input_ids"]
        out.append(list(ids))
    return out


@torch.inference_mode()
def next_token_logits(runner, inputs: list[list[int]], positions: int = POSITIONS) -> list[torch.Tensor]:
    """float32 logits [positions, vocab] at the last `positions` positions of each input, through
    `runner` (engine/runtime/runner.py: anything with device, new_cache and forward)."""
    out = []
    for ids in inputs:
        if len(ids) <= positions:
            raise ValueError(f"a quality input has {len(ids)} tokens; it needs more than {positions}")
        x = torch.tensor(ids, dtype=torch.long, device=runner.device)
        logits = runner.forward(x, runner.new_cache(len(ids)), all_logits=True)
        out.append(logits[-positions:].float().cpu())
    return out


def compare(reference: list[torch.Tensor], candidate: list[torch.Tensor],
            inputs: list[list[int]] | None = None) -> dict:
    """top1_agreement and mean_kl of `candidate` against `reference` (same inputs, same order); with
    `inputs` (the token ids both ran), each model's perplexity on the tokens that actually follow."""
    ref, cand = torch.cat(reference), torch.cat(candidate)
    ref_logp, cand_logp = ref.log_softmax(-1), cand.log_softmax(-1)
    kl = (ref_logp.exp() * (ref_logp - cand_logp)).sum(-1).clamp(min=0)
    out = {
        "top1_agreement": (ref.argmax(-1) == cand.argmax(-1)).float().mean().item(),
        "mean_kl": kl.mean().item(),
        "positions": ref.shape[0],
    }
    if inputs is not None:
        out["perplexity"] = perplexity(candidate, inputs)
        out["reference_perplexity"] = perplexity(reference, inputs)
    return out


def perplexity(logits: list[torch.Tensor], inputs: list[list[int]]) -> float:
    """exp(mean NLL) of each input's next tokens under `logits` (next_token_logits of those inputs:
    the last position of each predicts past the input, so it is left out)."""
    nll = []
    for lg, ids in zip(logits, inputs):
        n = lg.shape[0]
        targets = torch.tensor(ids[len(ids) - n + 1:], dtype=torch.long)
        nll.append(-lg[:-1].float().log_softmax(-1).gather(1, targets[:, None]).squeeze(1))
    return float(torch.cat(nll).mean().exp())
