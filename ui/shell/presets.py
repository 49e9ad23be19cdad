"""Prompt sets (ui/shell/prompts/*.json) and the one-click teaching presets built on them.

A prompt set is `{title, description, items: [{history?, turns: [...]}]}`: each item is one
conversation — an optional history the server seeds, then user turns sent one by one, so a
multi-turn item shows what KV reuse does to later turns. A teaching preset pairs one item
with two configs that differ in exactly one toggle.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.core.errors import InvalidRequest

ASSETS = Path(__file__).resolve().parent / "prompts"  # package data: installed with ui/
MAX_CUSTOM_PROMPTS = 200


def load_prompt_sets(folder: Path = ASSETS) -> dict[str, dict]:
    sets = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        for i, item in enumerate(data["items"]):
            if not item.get("turns"):
                raise ValueError(f"{path.name}: item {i} has no turns")
        sets[path.stem] = data
    return sets


def custom_prompt_set(text: str) -> dict:
    """The user's own list: one prompt per line (blank lines ignored)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not lines:
        raise InvalidRequest("write at least one prompt, one per line", "prompts")
    if len(lines) > MAX_CUSTOM_PROMPTS:
        raise InvalidRequest(f"at most {MAX_CUSTOM_PROMPTS} prompts per sweep", "prompts")
    return {"title": "Your prompts", "description": "", "items": [{"turns": [line]} for line in lines]}


# The weights the quantization preset gives B, named once: the 4-bit variant on our integer kernels that
# keeps quality (engine/quant/quantize.py; docs/quantization.md: measured with `python -m engine.bench quant`
# and `python -m engine.bench peer`). Where its kernels cannot run, the preset says why instead of running
# (the torch reference would teach that 4-bit weights are slow).
QUANT_VARIANT = "int4w8a+head8"
# The weights the bf16-weights preset gives B: the same model with each weight rounded once to bf16 and the math kept
# fp32 (engine/quant/bf16_weights.py), on our panel kernel; where that kernel cannot run, the preset says why.
BF16_WEIGHTS_VARIANT = "bf16wo+head"


def _weights_panes(variant: str) -> dict:
    """A weights preset's panes: A with the weights as loaded, B with `variant` (which the preset needs), on the
    same open question."""
    return {"set": "open_questions", "item": 2, "a": {"quantization": None}, "b": {"quantization": variant},
            "needs_variant": variant}  # over what load, with which of our kernels: ui/compare/tab.py preset_missing


# Each teaching preset changes one thing between A and B, so the delta table shows one effect.
TEACHING = {
    "kv_reuse": {
        "title": "Long conversation: KV reuse off vs on",
        "explain": "Both panes continue the same ~1,000-token conversation for two turns. A prefills the "
                   "whole history every turn; B reuses the KV of what it already saw, so its second turn "
                   "prefills only the new tokens. Watch TTFT and 'cached' in the delta table.",
        "set": "long_history", "item": 0,
        "a": {"kv_reuse": False}, "b": {"kv_reuse": True},
    },
    "prompt_lookup": {
        "title": "Copy-heavy edit: prompt lookup off vs on",
        "explain": "The reply mostly copies the prompt. B drafts tokens by looking them up in the prompt "
                   "and verifies several per forward pass; watch tok/s, acceptance and the token timeline's "
                   "steps (several tokens at one instant).",
        "set": "copy_edits", "item": 0,
        "a": {"speculative": "off"}, "b": {"speculative": "prompt_lookup", "num_speculative_tokens": 8},
    },
    "smoothing": {
        "title": "Bursty reply: smoothing off vs adaptive",
        "explain": "Both panes write the same copy-heavy edit with prompt lookup on, so tokens come in bursts "
                   "(several per verify step). A paints each burst as it lands; B's adaptive smoothing releases "
                   "the text word by word at the pace the bursts arrive, holding nothing more than "
                   "150 ms. Compare word-gap CV, longest stall and smoothing hold in the delta table.",
        "set": "copy_edits", "item": 0,
        "a": {"speculative": "prompt_lookup", "num_speculative_tokens": 8, "max_new_tokens": 96, "smoothing": "off"},
        "b": {"speculative": "prompt_lookup", "num_speculative_tokens": 8, "max_new_tokens": 96,
              "smoothing": "adaptive", "smooth_unit": "word"},
    },
    "chunked_prefill": {
        "title": "Long prompt: one-forward prefill vs chunked",
        "explain": "Both panes prefill the same ~1,000-token conversation (KV reuse off, so every turn prefills "
                   "it all). A runs it in one forward pass: the page can only say 'processing the prompt'. "
                   "B runs it in chunks and reports each: a progress bar, at a small cost in prefill time.",
        "set": "long_history", "item": 0,
        "a": {"kv_reuse": False, "chunked_prefill": False}, "b": {"kv_reuse": False, "chunked_prefill": True},
    },
    "streaming": {
        "title": "Streaming on vs off",
        "explain": "The same reply, streamed (A) and delivered in one piece when complete (B). The server's TTFT "
                   "is the same; B's reader sees the first word only at the total time.",
        "set": "open_questions", "item": 0,
        "a": {"streaming": True, "max_new_tokens": 64}, "b": {"streaming": False, "max_new_tokens": 64},
    },
    "network": {
        "title": "Loopback vs 4G",
        "explain": "The same config over loopback (A) and a simulated 4G link (B: 50 ms one way ± 15 ms, 10 Mbit/s). "
                   "The server's figures match; B's browser figures are later by about one round trip. The Sweep "
                   "does not apply the network, so there these two are one config: an A/A check.",
        "set": "open_questions", "item": 1,
        "a": {"network": "loopback"}, "b": {"network": "4g"},
    },
    "compiled_step": {
        "title": "4-bit weights: eager step vs compiled step",
        "explain": "Both panes decode with the same 4-bit weight-only variant (int4wo+head). With weights this small the "
                   "matmuls are only about half of a step; the rest is ~900 small operations launched one by one. B "
                   "runs each step as one torch.compile graph that fuses them. Watch TPOT and tok/s; B's first turn "
                   "also shows the one-time compile in its setup time.",
        "set": "open_questions", "item": 2,
        "a": {"quantization": "int4wo+head"}, "b": {"quantization": "int4wo+head", "compiled_decode": True},
        "needs_variant": "int4wo+head",
    },
    "bf16_weights": {
        "title": f"fp32 weights vs bf16 weights ({BF16_WEIGHTS_VARIANT})",
        "explain": f"Same prompt: A with the fp32 weights as loaded, B with every weight rounded once to bf16 "
                   f"({BF16_WEIGHTS_VARIANT}); the activations, sums, norms and KV cache stay fp32. A decode step reads "
                   "every weight once, so B's step reads about half the bytes: watch B's decode rate (tok/s, TPOT) and "
                   "bytes per token. The weights' rounding is B's only error, measured, not assumed: the line under "
                   "the delta table says whether the greedy replies match, and after B's first reply the engine "
                   "measures its top-1 agreement with the fp32 weights (engine info). B's first turn also rounds the "
                   "weights (setup, inside TTFT): run the pair again for the TTFT that follows.",
        **_weights_panes(BF16_WEIGHTS_VARIANT),
    },
    "quantization": {
        "title": f"Weights as loaded vs 4-bit ({QUANT_VARIANT})",
        "explain": f"Same prompt: A with the weights as loaded, B with {QUANT_VARIANT} (4-bit blocks, an int8 lm_head, "
                   "the activations quantized to int8 per block of 32: integer dot products on our kernels). What to "
                   "see: B's decode rate (tok/s, TPOT) several times A's, as a step reads a fraction of the bytes "
                   "(bytes per token). Quality is measured, not assumed: the line under the delta table says whether "
                   "the greedy replies match and where they part; the Sweep's token agreement measures it over a "
                   "prompt set, and after B's first reply the engine measures its top-1 agreement with the loaded "
                   "weights once (engine info; the next request waits for it in its queue). The first token: B's "
                   "first turn also quantizes the weights (setup, inside TTFT): run the pair again for the TTFT that "
                   "follows. A long prompt's prefill runs the same integer kernels on CPUs with VNNI (in AMX tiles, "
                   "16 rows at a time, where the CPU has AMX: the same bits, faster); with AVX2 "
                   "only, past 256 prompt tokens it takes the fp32 GEMM over dequantized weights, where B's first "
                   "token can cost more than A's (engine info's kernels say which).",
        **_weights_panes(QUANT_VARIANT),
    },
}


def teaching_presets(prompt_sets: dict[str, dict]) -> dict[str, dict]:
    """The presets with their conversation filled in: {name: {title, explain, a, b, history, turns}}."""
    out = {}
    for name, p in TEACHING.items():
        item = prompt_sets[p["set"]]["items"][p["item"]]
        out[name] = {**p, "history": item.get("history", []), "turns": list(item["turns"])}
    return out
