"""A pane's settings as the page sends them → (system prompt, GenerationConfig).

The page's controls are named by `FIELDS`, which derives from the declarations: the system
prompt, the sampling fields the page offers and every engine toggle (engine/core/config.py
SAMPLING and TOGGLES), the backend, and the page's own settings (`PAGE_SETTINGS`: how the
browser paints text; the engine never sees them). The page's JS zips its controls' values with
these names and sends an object keyed by name.

The controls produce plain JSON values (sliders may give 64.0 for 64, an empty seed field gives
None). Everything the engine cannot honour becomes an `InvalidRequest` naming the field, shown in
the page next to the reply that did not run.
"""

from __future__ import annotations

from engine.core.config import SAMPLING, TOGGLES, GenerationConfig
from engine.core.errors import InvalidRequest
from engine.core.toggles import Toggle

from .network import NETWORKS
from .perceived import SMOOTHING_MODES, SMOOTHING_UNITS

MAX_SYSTEM_CHARS = 20_000
SMOOTH_MAX_HOLD_MS = 150  # adaptive smoothing never holds text back longer than this after it arrived
ON_PAGE = tuple(t for t in SAMPLING if t.page)  # top_k and stop: API and CLI only
# Each pane starts from the declarations' defaults but for these, its own named overrides: a chat
# reply of up to 128 tokens; A/B panes (and their presets) greedy and 64 tokens, short and comparable.
CHAT_PANE = {"max_new_tokens": 128}
AB_PANE = {"temperature": 0.0, "max_new_tokens": 64}
RANDOM_SEED = ("", -1, -1.0)  # an empty seed box (and -1, which older pages sent): a random seed
PAGE_SETTINGS = (
    Toggle("smoothing", "choice", "off", "Smooth streaming",
           f"how the page paints text that arrived: adaptive paces it by the arrivals and holds text at most "
           f"{SMOOTH_MAX_HOLD_MS} ms; pace paints at reading pace", choices=SMOOTHING_MODES,
           glossary="paint_gap_max_ms", backends=("page",), short="smooth"),
    Toggle("smooth_unit", "choice", "word", "Smooth by", "paint whole words or single characters",
           choices=SMOOTHING_UNITS, backends=("page",), only_with="smoothing", short="by"),
    Toggle("streaming", "bool", True, "Streaming",
           "show text as it arrives; off: the server still streams and measures, but the page gets the reply "
           "only when it is complete (as a non-streaming response)", glossary="client_first_word_ms",
           backends=("page",), off_label="not streamed"),
    Toggle("network", "choice", "loopback", "Network (simulated)",
           "delays the page's own request and reply stream (our SSE transport) as this link would "
           "(one-way delay ± jitter, bandwidth); the server's figures stay the engine's", choices=NETWORKS, glossary="network_in_ms",
           backends=("page",), short="network"),
    Toggle("net_delay_ms", "int", 50, "One-way delay (ms)", "custom network: one-way propagation delay",
           lo=0, hi=5000, backends=("page",), only_with="network=custom", short="delay"),
    Toggle("net_jitter_ms", "int", 10, "Jitter (± ms)", "custom network: each trip's delay varies by up to this",
           lo=0, hi=1000, backends=("page",), only_with="network=custom", short="jitter"),
    Toggle("net_kbps", "int", 10_000, "Bandwidth (kbit/s)", "custom network: link bandwidth, 0 = unlimited",
           lo=0, hi=10_000_000, backends=("page",), only_with="network=custom", short="kbit/s"),
)
FIELDS = ["system", *(t.name for t in (*ON_PAGE, *TOGGLES)), "backend", *(t.name for t in PAGE_SETTINGS)]


def defaults() -> dict:
    """Every field the page sends, at its declared default. The panes start from their own overrides
    of some (CHAT_PANE, AB_PANE: 128 and 64 tokens where the declaration says 256); callers that
    build settings from these (ui/bench.py) set the tokens they want."""
    return {"system": "", **{t.name: t.default for t in (*ON_PAGE, *TOGGLES, *PAGE_SETTINGS)}, "backend": ""}


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
    if s.get("seed") in RANDOM_SEED:
        s.pop("seed")
    page_settings(s)
    changes = {t.name: t.coerce(s[t.name]) for t in ON_PAGE if s.get(t.name) is not None}
    changes.update({t.name: t.coerce(s[t.name]) for t in TOGGLES if t.name in s})
    config = GenerationConfig(**changes)
    return (system.strip() or None) if system else None, config


def normalized(settings: dict | None) -> dict:
    """The settings as they were applied (for records and exports)."""
    system, config = parse(settings)
    return {"system": system, **{t.name: getattr(config, t.name) for t in (*ON_PAGE, *TOGGLES)},
            **page_settings(settings)}


def page_settings(settings: dict | None) -> dict:
    """The pane's own settings (smoothing...), checked against their declarations, defaults filled in."""
    s = settings or {}
    return {t.name: t.read(s) for t in PAGE_SETTINGS}
