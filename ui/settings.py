"""A pane's settings as the page sends them → (system prompt, GenerationConfig).

The page's controls produce plain JSON values (sliders may give 64.0 for 64, an empty seed
field gives None). Everything the engine cannot honour becomes an `InvalidRequest` naming the
field, shown in the page next to the reply that did not run.
"""

from __future__ import annotations

from engine.config import GenerationConfig
from engine.errors import InvalidRequest

from .perceived import SMOOTHING_MODES, SMOOTHING_UNITS

DEFAULT_VARIANT = "default"  # the page's name for GenerationConfig.quantization = None
MAX_SYSTEM_CHARS = 20_000
# The fields a pane's controls send, in the order the page lists its controls.
FIELDS = ["system", "max_new_tokens", "temperature", "top_p", "seed", "kv_reuse", "speculative",
          "num_speculative_tokens", "quantization", "backend",  # backend: read by ChatStore, not here
          "chunked_prefill", "smoothing", "smooth_unit"]  # smoothing: the page's own, never the engine's
SMOOTH_MAX_HOLD_MS = 150  # adaptive smoothing never holds text back longer than this after it arrived


def _int(name: str, value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value  # GenerationConfig.validate rejects anything else, naming the field


def parse(settings: dict | None) -> tuple[str | None, GenerationConfig]:
    if settings is not None and not isinstance(settings, dict):
        raise InvalidRequest("settings must be an object of setting: value", "settings")
    s = dict(settings or {})
    unknown = set(s) - set(FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown setting(s): {', '.join(sorted(unknown))}", sorted(unknown)[0])
    system = s.get("system") or None
    if system is not None and (not isinstance(system, str) or len(system) > MAX_SYSTEM_CHARS):
        raise InvalidRequest(f"the system prompt must be text of at most {MAX_SYSTEM_CHARS:,} characters", "system")
    seed = s.get("seed")
    if seed in ("", -1, -1.0):  # the page's "random seed"
        seed = None
    smoothing(s)
    quant = s.get("quantization")
    if quant in ("", DEFAULT_VARIANT):
        quant = None
    defaults = GenerationConfig()
    config = GenerationConfig(
        max_new_tokens=_int("max_new_tokens", s.get("max_new_tokens", defaults.max_new_tokens)),
        temperature=s.get("temperature", defaults.temperature),
        top_p=s.get("top_p", defaults.top_p),
        seed=_int("seed", seed),
        kv_reuse=s.get("kv_reuse", defaults.kv_reuse),
        speculative=s.get("speculative", defaults.speculative),
        num_speculative_tokens=_int("num_speculative_tokens",
                                    s.get("num_speculative_tokens", defaults.num_speculative_tokens)),
        quantization=quant,
        chunked_prefill=s.get("chunked_prefill", defaults.chunked_prefill),
    )
    return (system.strip() or None) if system else None, config.validate()


def normalized(settings: dict | None) -> dict:
    """The settings as they were applied (for records and exports)."""
    system, config = parse(settings)
    return {"system": system, "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
            "top_p": config.top_p, "seed": config.seed, "kv_reuse": config.kv_reuse,
            "speculative": config.speculative, "num_speculative_tokens": config.num_speculative_tokens,
            "quantization": config.quantization, "chunked_prefill": config.chunked_prefill,
            **smoothing(settings)}


def smoothing(settings: dict | None) -> dict:
    """The pane's smoothing (how the page paints text that arrived; the engine never sees it)."""
    s = settings or {}
    mode, unit = s.get("smoothing") or "off", s.get("smooth_unit") or "word"
    if mode not in SMOOTHING_MODES:
        raise InvalidRequest(f"smoothing must be one of {', '.join(SMOOTHING_MODES)}", "smoothing")
    if unit not in SMOOTHING_UNITS:
        raise InvalidRequest(f"smooth_unit must be one of {', '.join(SMOOTHING_UNITS)}", "smooth_unit")
    return {"smoothing": mode, "smooth_unit": unit}
