"""What the page shows about the engine, read defensively: features that other branches add
(quantization variants, prefix-cache stats) appear when the engine reports them, and the page
works without them.
"""

from __future__ import annotations

from .settings import DEFAULT_VARIANT


def describe(engine) -> dict:
    """engine.info() plus nothing invented: {} if the engine cannot say."""
    try:
        return dict(engine.info())
    except Exception:  # a remote engine that is down must not take the page with it
        return {}


def variants(info: dict) -> list[str]:
    """Quantization variant names to offer, the default first.

    Reads `info["variants"]` — a list of names or of dicts with a "name", or a dict keyed by
    name — which the quantization work (#5) is expected to add to `Engine.info()`. Until then
    only the default variant exists.
    """
    raw = info.get("variants") or []
    if isinstance(raw, dict):
        names = list(raw)
    else:
        names = [v.get("name") if isinstance(v, dict) else v for v in raw]
    names = [str(n) for n in names if n and n != DEFAULT_VARIANT]
    return [DEFAULT_VARIANT] + names


def weight_bytes(info: dict, variant: str | None) -> int | None:
    """Bytes of the chosen variant's weights, if the engine reports them."""
    raw = info.get("variants")
    if variant and variant != DEFAULT_VARIANT:
        entry = None
        if isinstance(raw, dict):
            entry = raw.get(variant)
        elif isinstance(raw, list):
            entry = next((v for v in raw if isinstance(v, dict) and v.get("name") == variant), None)
        return entry.get("weight_bytes") if isinstance(entry, dict) else None
    return info.get("weight_bytes")


def headline(info: dict) -> str:
    """One line for the page header: 'SmolLM2-135M-Instruct · bf16 · cpu · 2 threads · 269 MB'."""
    if not info:
        return "engine: no information"
    parts = [str(info.get("name", "model"))]
    for key in ("dtype", "device"):
        if info.get(key) and info[key] != "-":
            parts.append(str(info[key]))
    if info.get("threads"):
        parts.append(f"{info['threads']} threads")
    if info.get("weight_bytes"):
        parts.append(f"{info['weight_bytes'] / 1e6:,.0f} MB weights")
    batching = info.get("batching")
    if isinstance(batching, dict) and batching.get("max_batch", 1) > 1:  # --max-batch N (docs/batching.md)
        parts.append(f"continuous batching, max batch {batching['max_batch']} (speculative requests unbatched)")
    return " · ".join(parts)
