"""A pane's settings as the page sends them → `PaneSettings`: read once per turn, one GenerationConfig.

The page's controls are named by `FIELDS`, which derives from the declarations: the system
prompt, the sampling fields the page offers and every engine toggle (engine/core/config.py
SAMPLING and TOGGLES), the backend, and the page's own settings (`PAGE_SETTINGS`: how the
browser paints text; the engine never sees them). The page's JS zips its controls' values with
these names and sends an object keyed by name.

The controls produce plain JSON values (sliders may give 64.0 for 64, an empty seed field gives
None). They are read by the page's one settings parser (ui/shell/form.py); everything the engine
cannot honour becomes an `InvalidRequest` naming the field, shown in the page next to the reply that
did not run. The chat, the A/B panes and the Sweep all read a pane so, once per turn (the Sweep: once
per config).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.config import SAMPLING, TOGGLES, GenerationConfig
from engine.core.errors import InvalidRequest
from engine.core.toggles import Toggle

from ..shell.form import Form, choose
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
FORM = Form((*ON_PAGE, *TOGGLES, *PAGE_SETTINGS), ("system", "backend"))
FIELDS = ["system", *(t.name for t in (*ON_PAGE, *TOGGLES)), "backend", *(t.name for t in PAGE_SETTINGS)]  # the controls' order


def defaults() -> dict:
    """Every field the page sends, at its declared default. The panes start from their own overrides
    of some (CHAT_PANE, AB_PANE: 128 and 64 tokens where the declaration says 256); callers that
    build settings from these (ui/bench.py) set the tokens they want."""
    return {"system": "", **{t.name: t.default for t in (*ON_PAGE, *TOGGLES, *PAGE_SETTINGS)}, "backend": ""}


@dataclass(frozen=True)
class PaneSettings:
    """A pane's settings, read: what the server is asked (`system`, `config`, `backend`) and what the page
    does with the reply (`page`: smoothing, streaming, the simulated network; the engine never sees it)."""

    system: str | None
    config: GenerationConfig
    backend: str | None  # None: the default backend (read() without the backends' names)
    page: dict  # every PAGE_SETTINGS name: its value

    @classmethod
    def read(cls, values, backends: Sequence[str] | None = None) -> PaneSettings:
        """`values` as the page sends them; `backends`: the names on offer (the first the default), to check."""
        if isinstance(values, dict) and values.get("seed") in RANDOM_SEED:
            values = {**values, "seed": None}
        got = FORM.read(values)
        system = got["system"] or None
        if system is not None and (not isinstance(system, str) or len(system) > MAX_SYSTEM_CHARS):
            raise InvalidRequest(f"the system prompt must be text of at most {MAX_SYSTEM_CHARS:,} characters", "system")
        config = GenerationConfig(**{t.name: got[t.name] for t in (*ON_PAGE, *TOGGLES)})
        backend = choose(got["backend"], backends, "backend") if backends else got["backend"] or None
        return cls((system.strip() or None) if system else None, config, backend,
                   {t.name: got[t.name] for t in PAGE_SETTINGS})

    def asks_server(self) -> tuple:
        """What the server is asked for: two panes equal here differ only in the page's own settings."""
        return self.system, self.config, self.backend

    def applied(self) -> dict:
        """The settings as they were applied (records, exports, config labels)."""
        return {"system": self.system, **{t.name: getattr(self.config, t.name) for t in (*ON_PAGE, *TOGGLES)},
                **self.page, "backend": self.backend}
