"""What-if: a reply's TTFT and TPOT predicted for another prompt length, weights variant or batch
size, from the model's bytes and FLOPs (engine/serving/work.py) and what this machine measured.

A forward pass is modelled as reading the weights once plus computing each row:
    pass(n rows) = t_read + (FLOP(n) − FLOP(1)) / R
t_read is a one-token pass: this reply's plain decode step (TPOT; with speculation on, the plain step
the cost calibration measured), or, unknown, the step's weight bytes / the machine's measured copy
bandwidth (machine_limits.py). R, the FLOP rate the prompt's extra rows ran at, comes from this
reply's prefill: (FLOP(prefill tokens) − FLOP(1)) / (prefill_ms − t_read), or, where the prompt was
too short to tell, the machine's measured matmul peak. FLOP(n) includes attention over the cached
and new keys (work.prefill_flops), so a longer prompt costs more than linearly.

* prompt length: prefill = pass(n'), the stages around it (queue, setup, gaps) as measured;
* weights variant: decode reads weight bytes, so TPOT scales by bytes' / bytes, and so does t_read
  in prefill (the compute rate is kept: a quantized kernel's own speed is not modelled, it is said);
* batch size: a step computes b rows for one read of the weights: t_read + (b − 1) × 2 × layer
  matmul parameters / R.

Reads the limits only through the Timeline (its roofline inputs) and MachineLimits' public fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.core.counters import Counters
from engine.serving.work import ModelShape, prefill_flops


@dataclass(frozen=True)
class Fit:
    t_read_ms: float  # a one-token pass
    flops_per_ms: float  # R
    read_from: str  # "this reply's TPOT" | "the calibrated plain step" | "weight bytes / read bandwidth"
    rate_from: str  # "this reply's prefill" | "the machine's matmul peak"
    cached_tokens: int
    weight_bytes: float | None


@dataclass(frozen=True)
class Prediction:
    prefill_tokens: int
    batch: int
    weight_bytes: float | None
    prefill_ms: float
    ttft_ms: float
    tpot_ms: float | None
    how: str

    def to_dict(self) -> dict:
        return asdict(self)


def fit(tl: dict, shape: ModelShape) -> Fit | None:
    """The two figures of the pass model from one reply's Timeline dict (None: too little measured)."""
    roof = tl.get("roofline") or {}
    n, cached, prefill_ms = tl.get("prefill_tokens"), tl.get("cached_tokens") or 0, tl.get("prefill_ms")
    if not n or prefill_ms is None or tl.get("ttft_ms") is None:
        return None
    weights = roof.get("weight_bytes") or tl.get("weight_bytes")
    spec = Counters.from_dict(tl).speculation
    if spec is not None and (spec.draft_step_count or spec.drafted):
        read, read_from = spec.plain_step_ms, "the calibrated plain step"
    else:
        read, read_from = tl.get("tpot_ms"), "this reply's TPOT"
    if not read and weights and roof.get("read_gbps"):  # decode's roof (engine/measure/machine_limits.py)
        read, read_from = weights / (roof["read_gbps"] * 1e6), "weight bytes / read bandwidth"
    if not read:
        return None
    extra = prefill_flops(shape, n, cached) - prefill_flops(shape, 1, cached + n - 1)
    if n > 1 and prefill_ms > 1.2 * read:  # the rows cost visibly more than one pass: their rate shows
        rate, rate_from = extra / (prefill_ms - read), "this reply's prefill"
    elif roof.get("peak_tflops"):
        rate, rate_from = roof["peak_tflops"] * 1e9, "the machine's matmul peak"
    else:
        return None
    return Fit(read, rate, read_from, rate_from, cached, weights)


def predict(tl: dict, shape: ModelShape, *, prefill_tokens: int | None = None, weight_bytes: float | None = None,
            batch: int = 1, cached_tokens: int | None = None) -> Prediction | None:
    """TTFT and TPOT of the same reply with another prefill length (after `cached_tokens`: by
    default the reply's own), weights size or batch size."""
    f = fit(tl, shape)
    if f is None:
        return None
    n = prefill_tokens or tl["prefill_tokens"]
    c = f.cached_tokens if cached_tokens is None else cached_tokens
    scale = weight_bytes / f.weight_bytes if weight_bytes and f.weight_bytes else 1.0
    read = f.t_read_ms * scale
    prefill = read + (prefill_flops(shape, n, c) - prefill_flops(shape, 1, c + n - 1)) / f.flops_per_ms
    ttft = tl["ttft_ms"] - tl["prefill_ms"] + prefill
    tpot = tl.get("tpot_ms")
    if tpot is not None:
        tpot = tpot * scale + (batch - 1) * 2.0 * shape.layer_matmul_params / f.flops_per_ms
    how = (f"a pass = one read of the weights ({f.t_read_ms:,.1f} ms: {f.read_from}"
           + (f", × {scale:.2f} for the weights" if scale != 1.0 else "")
           + f") + its extra rows' FLOPs at {f.flops_per_ms / 1e9:.3f} TFLOP/s ({f.rate_from})")
    return Prediction(n, batch, weight_bytes or f.weight_bytes, prefill, ttft, tpot, how)


def longer_messages(tokenizer, messages: list[dict], factor: float) -> tuple[list[dict], int, int]:
    """The conversation with its last message repeated (whole copies) until the prompt is about
    `factor` × as many tokens: (messages, base prompt tokens, new prompt tokens)."""
    from engine.serving.generate import build_prompt_ids

    base = len(build_prompt_ids(tokenizer, messages))
    text = messages[-1]["content"]
    best = None
    for copies in range(1, 4096):
        trial = [*messages[:-1], {**messages[-1], "content": "\n\n".join([text] * copies)}]
        n = len(build_prompt_ids(tokenizer, trial))
        if best is None or abs(n - factor * base) < abs(best[1] - factor * base):
            best = (trial, n)
        if n >= factor * base:
            break
    return best[0], base, best[1]
