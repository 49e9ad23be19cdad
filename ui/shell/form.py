"""A form of declared settings, as the page sends one: an object of setting: value, read once.

Each declared setting is read by its declaration (`Toggle.read`, engine/core/toggles.py: its default when
missing or empty, else coerced and checked, an InvalidRequest naming it otherwise); a form's other
fields (a backend, a prompt set, a probe) are handed to its owner as given. This is the page's one
settings parser: a chat pane's (ui/chat/settings.py, which builds the turn's GenerationConfig from it)
and the Load tab's two modes (ui/load/run.py, open_run.py) read their values here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.errors import InvalidRequest
from engine.core.toggles import Toggle


@dataclass(frozen=True)
class Form:
    declared: tuple[Toggle, ...]
    free: tuple[str, ...] = ()  # read by the form's owner

    @property
    def fields(self) -> list[str]:
        """Every field's name, in the order the page's controls are zipped with (its scripts use it)."""
        return [*(t.name for t in self.declared), *self.free]

    def read(self, values) -> dict:
        """{name: value}: each declared setting read, each free field as given (None when missing)."""
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise InvalidRequest("settings must be an object of setting: value", "settings")
        unknown = sorted(map(str, set(values) - set(self.fields)))
        if unknown:
            raise InvalidRequest(f"unknown setting(s): {', '.join(unknown)}", unknown[0])
        return {**{t.name: t.read(values) for t in self.declared}, **{f: values.get(f) for f in self.free}}


def choose(value, names: Sequence[str], field: str) -> str:
    """`value` if it is one of `names` (the first of them when it is missing or empty), else an
    InvalidRequest naming the choices: a backend, a prompt set."""
    if value is None or value == "":
        return names[0]
    if not isinstance(value, str) or value not in names:
        raise InvalidRequest(f"{field} must be one of {', '.join(names)}", field)
    return value
