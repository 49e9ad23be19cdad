"""A declared setting's control: each sampling field and engine toggle (engine/core/config.py), each page
setting (ui/chat/settings.py) and each Load setting (ui/load/) becomes the control its kind calls for,
with its label, help, default, bounds and step."""

from __future__ import annotations

import gradio as gr

from engine.core.config import FIELD
from engine.core.info import EngineInfo
from engine.core.toggles import Toggle

from . import engine_info

SLIDER_MAX_STEPS = 64  # an int toggle with a wider range gets a number box, not a slider


ELEM_NAMES = {"max_new_tokens": "max"}  # the page's scripts and tests address the max tokens slider as lab-<pane>-max


def elem_id(pane: str, t: Toggle) -> str:
    """lab-<pane>-<name>; a GenerationConfig field may go by a shorter name (ELEM_NAMES), another
    declaration (the Load tab's own max tokens) keeps its own."""
    name = ELEM_NAMES.get(t.name, t.name) if FIELD.get(t.name) is t else t.name
    return f"lab-{pane}-{name.replace('_', '-')}"


def toggle_control(t: Toggle, pane: str, info: EngineInfo, value=None, labels: dict | None = None):
    """The Gradio control for one declared field, starting at `value` (None: its declared default);
    `labels`: a choice's words on the page, by value (its value where none is given)."""
    value = t.default if value is None else value
    kw = dict(label=t.label, info=t.help, elem_id=elem_id(pane, t))
    if t.kind == "bool":
        why = info.unavailable_toggles.get(t.name)  # e.g. no C++ compiler for the compiled step: shown, not offered
        if why:
            return gr.Checkbox(value=False, interactive=False, **{**kw, "info": f"{t.help}. Not on this machine: {why}"})
        note = engine_info.compiled_weights_note(info) if t.name == "compiled_decode" else ""
        return gr.Checkbox(value=value, **{**kw, "info": f"{t.help}. {note}" if note else t.help})
    if t.kind in ("int", "float"):
        lo, hi = slider_range(t, info)
        if lo is not None and hi is not None and (t.step or t.kind == "int" and hi - lo <= SLIDER_MAX_STEPS):
            return gr.Slider(lo, hi, value=value, step=t.step or 1, **kw)
        return gr.Number(value=value, precision=0 if t.kind == "int" else None, minimum=t.lo, maximum=t.hi, **kw)
    if t.kind == "variant":
        choices = engine_info.variant_choices(info) or [("as loaded", "")]
        note = engine_info.unavailable_note(info.variants)
        return gr.Dropdown(choices, value=choices[0][1], **{**kw, "info": " ".join(filter(None, [t.help, note]))})
    if t.kind == "choice":
        if t.name == "speculative":
            names = engine_info.speculation_choices(info)
            note = engine_info.unavailable_note(info.speculation)
            kw["info"] = " ".join(filter(None, [t.help, note]))
        else:
            names = list(t.choices)
        return gr.Dropdown([((labels or {}).get(c, c), c) for c in names], value=value, **kw)
    raise TypeError(f"toggle {t.name}: no control for kind {t.kind!r}")


def slider_range(t: Toggle, info: EngineInfo) -> tuple:
    """A number's range on the page: its declared bounds; an open lower bound starts one step above
    it (top-p > 0); no upper bound on max tokens: the model's context is the one there is."""
    lo = t.lo + t.step if t.lo_open and t.step else t.lo
    hi = info.context_max if t.hi is None and t.name == "max_new_tokens" else t.hi
    return lo, hi
