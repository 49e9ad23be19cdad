"""Every request setting declared once, as a `GenerationConfig` field carrying a `Toggle`: the
sampling fields (max tokens, temperature, top-p, top-k, seed, stop; `sampling=True`) and the
optimization toggles.

A declaration (name, kind, default, bounds, slider step, help, glossary entry, which backends
honour it) is the metadata of its field in engine/core/config.py. Everything else derives from it:
`GenerationConfig`'s check at construction, the API's body model (server/protocol.py), the CLI flags
(engine/cli.py), the page's controls and labels (ui/shell/controls.py, ui/chat/records.py), the remote
engine's forwarding (engine/remote/wire.py), the sweep and the exports. Adding a toggle is one
`toggle(...)` field plus the code that honours it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.core.errors import InvalidRequest

BACKENDS = ("local", "remote-lab")  # our own engine; another Latency Lab server behind the remote engine


@dataclass(frozen=True)
class Toggle:
    name: str  # the GenerationConfig field, the API body field and the page setting
    kind: str  # bool | int | float | choice | variant (a quantization variant name; None = the default) | strings
    default: object  # an int whose default is None (the seed) may be None: unset
    label: str  # the page's control label and the A/B config label
    help: str  # hover text, CLI help
    choices: tuple[str, ...] = ()
    lo: int | float | None = None
    hi: int | float | None = None  # strings: the most strings
    lo_open: bool = False  # float: the bound itself is refused (top_p > 0)
    step: float | None = None  # the page's slider step; a field with a step is a slider whatever its range
    max_chars: int | None = None  # strings: the most characters of each
    sampling: bool = False  # a sampling field, not an optimization toggle (config labels, remote forwarding)
    page: bool = True  # the page's panes offer a control for it
    glossary: str | None = None  # the metric (ui/shell/glossary.py) this toggle moves
    backends: tuple[str, ...] = BACKENDS  # who honours it; other remote servers never get it
    off_label: str | None = None  # the A/B label when a bool toggle is off ("no kv reuse")
    only_with: str | None = None  # the toggle that must be on (not at its default) for this one to matter
    short: str | None = None  # a name in config labels: "k" gives "k=8", "smooth" gives "smooth adaptive"
    # Whether switching it leaves a greedy fp32 reply token for token the same (the correctness
    # invariant the tests hold the engine to: KV reuse, speculation, chunked prefill, the compiled
    # step). None: by rule, an optimization toggle or a page setting is lossless and a sampling field
    # is not (`keeps_reply`); a toggle that changes the numbers (a weights variant) declares False.
    lossless: bool | None = None

    @property
    def keeps_reply(self) -> bool:
        """Lossless: switching it leaves a greedy fp32 reply identical (the A/B replies check says
        how many were; ui/compare/replies.py)."""
        return (not self.sampling) if self.lossless is None else self.lossless

    @property
    def cli_flag(self) -> str:
        """`--kv-reuse` style; a bool that defaults to on is switched with `--no-…` (see cli_names)."""
        return "--" + self.name.replace("_", "-")

    def applies(self, settings: dict) -> bool:
        """Whether this toggle matters under `settings`: `only_with` 'speculative' means 'speculative
        is not at its default'; 'network=custom' means 'network is custom'."""
        if not self.only_with:
            return True
        name, _, wanted = self.only_with.partition("=")
        if wanted:
            return str(settings.get(name)) == wanted
        return name in settings and settings[name] not in (None, False, "off", "")

    def check(self, value, name: str | None = None) -> None:
        """Raise InvalidRequest, naming the field (`name`: the API's name for it, e.g. max_tokens), for a
        value this field cannot take. These are the only words for a refused value, at every door."""
        name = name or self.name
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise InvalidRequest(f"{name} must be true or false, not {value!r}", name)
        elif self.kind == "int":
            if value is None and self.default is None:
                return
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequest(f"{name} must be an integer, not {value!r}", name)
            if self.lo is not None and value < self.lo:
                raise InvalidRequest(f"{name} must be at least {self.lo}, not {value}", name)
            if self.hi is not None and value > self.hi:
                raise InvalidRequest(f"{name} must be at most {self.hi}, not {value}", name)
        elif self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or isinstance(value, float) and not math.isfinite(value):
                raise InvalidRequest(f"{name} must be a finite number, not {value!r}", name)
            if value < self.lo or (self.lo_open and value == self.lo) or value > self.hi:
                lo_text = f"> {self.lo}" if self.lo_open else f">= {self.lo}"
                raise InvalidRequest(f"{name} must be {lo_text} and <= {self.hi}, not {value}", name)
        elif self.kind == "choice":
            if value not in self.choices:
                raise InvalidRequest(f"{name} must be one of {', '.join(self.choices)}, not {value!r}", name)
        elif self.kind == "variant":
            if value is not None and not isinstance(value, str):
                raise InvalidRequest(f"{name} must be a variant name, not {value!r}", name)
        elif self.kind == "strings":
            if not isinstance(value, tuple) or not all(isinstance(s, str) for s in value):
                raise InvalidRequest(f"{name} must be a list of strings", name)
            if len(value) > self.hi:
                raise InvalidRequest(f"at most {self.hi} {name} strings are allowed", name)
            if not all(0 < len(s) <= self.max_chars for s in value):
                raise InvalidRequest(f"each {name} string must have 1 to {self.max_chars} characters", name)
        else:  # a declaration error, caught by the tests that walk every toggle
            raise TypeError(f"toggle {self.name}: unknown kind {self.kind!r}")

    def coerce(self, value):
        """A value as a form or a slider sends it (64.0 for 64, '' for the default) → the toggle's type."""
        if self.kind == "int" and isinstance(value, float) and value.is_integer():
            return int(value)
        if self.kind == "variant" and value == "":
            return None
        if self.kind == "strings" and isinstance(value, list):
            return tuple(value)
        return value

    def read(self, given: dict):
        """This toggle's value in `given` (a form's or a request's values): the default when it is
        missing or empty, else coerced and checked (InvalidRequest naming the field)."""
        value = given.get(self.name)
        value = self.default if value is None or value == "" else self.coerce(value)
        self.check(value)
        return value

    def describe(self, value) -> str | None:
        """A short label of a value for config labels ('prompt lookup', 'k=4'), or None for a default.
        A toggle that only matters with another (`only_with`) is labelled whenever that one is on."""
        if self.short and self.kind == "int":
            return f"{self.short}={value}"
        if self.short and value != self.default or self.short and self.only_with:
            return f"{self.short} {str(value).replace('_', ' ')}"
        if value == self.default:
            return None
        if self.kind == "bool":
            return self.label.lower() if value else (self.off_label or f"no {self.label.lower()}")
        if self.kind in ("choice", "variant"):
            return str(value).replace("_", " ")
        return f"{self.label.lower()} {value}"

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "default": self.default, "label": self.label,
                "help": self.help, "choices": list(self.choices), "lo": self.lo, "hi": self.hi,
                "lo_open": self.lo_open, "step": self.step, "max_chars": self.max_chars,
                "glossary": self.glossary, "backends": list(self.backends), "lossless": self.keeps_reply}


def toggle(default, kind: str, label: str, help: str, **declaration):
    """A GenerationConfig field with its declaration (its name is filled in by `declared`)."""
    return field(default=default, metadata={"toggle": dict(kind=kind, default=default, label=label, help=help,
                                                           **declaration)})


def declared(config_class, sampling: bool = False) -> tuple[Toggle, ...]:
    """The fields of a dataclass declared with `toggle(...)`, in field order: the optimization
    toggles, or (`sampling=True`) the sampling fields."""
    from dataclasses import fields

    every = (Toggle(name=f.name, **f.metadata["toggle"]) for f in fields(config_class) if "toggle" in f.metadata)
    return tuple(t for t in every if t.sampling == sampling)
