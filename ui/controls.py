"""One pane's controls, built from the declarations: each sampling field and engine toggle
(engine/core/config.py) and each page setting (ui/settings.py) becomes the control its kind calls
for, with its label, help, default, bounds and step. Returned in the order of `settings.FIELDS`,
whose names the page's JS uses."""

from __future__ import annotations

import gradio as gr

from engine.core.config import FIELD, TOGGLES
from engine.core.info import EngineInfo
from engine.core.toggles import Toggle

from . import engine_info
from .network import PRESETS
from .settings import FIELDS, ON_PAGE, PAGE_SETTINGS

SLIDER_MAX_STEPS = 64  # an int toggle with a wider range gets a number box, not a slider
CHOICE_LABELS = {
    "smoothing": {"off": "off: paint text as it arrives", "adaptive": "adaptive", "pace": "reading pace"},
    "network": {**{name: link.describe() for name, link in PRESETS.items()}, "custom": "custom (the fields below)"},
}


ELEM_NAMES = {"max_new_tokens": "max"}  # the page's scripts and tests address the max tokens slider as lab-<pane>-max


def elem_id(pane: str, t: Toggle) -> str:
    """lab-<pane>-<name>; a GenerationConfig field may go by a shorter name (ELEM_NAMES), another
    declaration (the Load tab's own max tokens) keeps its own."""
    name = ELEM_NAMES.get(t.name, t.name) if FIELD.get(t.name) is t else t.name
    return f"lab-{pane}-{name.replace('_', '-')}"


def toggle_control(t: Toggle, pane: str, info: EngineInfo, value=None):
    """The Gradio control for one declared field, starting at `value` (None: its declared default)."""
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
        labels = CHOICE_LABELS.get(t.name, {})
        return gr.Dropdown([(labels.get(c, c), c) for c in names], value=value, **kw)
    raise TypeError(f"toggle {t.name}: no control for kind {t.kind!r}")


def slider_range(t: Toggle, info: EngineInfo) -> tuple:
    """A number's range on the page: its declared bounds; an open lower bound starts one step above
    it (top-p > 0); no upper bound on max tokens: the model's context is the one there is."""
    lo = t.lo + t.step if t.lo_open and t.step else t.lo
    hi = info.context_max if t.hi is None and t.name == "max_new_tokens" else t.hi
    return lo, hi


def settings_controls(pane: str, info: EngineInfo, backends: list[str], **overrides) -> list:
    """One pane's controls, in the order of settings.FIELDS (the page's JS zips them with those names).
    `overrides`: the pane's own starting values of some declared fields (settings.CHAT_PANE, AB_PANE)."""
    for name, value in overrides.items():
        FIELD[name].check(value)
    controls = {}
    declared = [*ON_PAGE, *TOGGLES, *PAGE_SETTINGS]
    for pair in (declared[i:i + 2] for i in range(0, len(declared), 2)):
        with gr.Row():
            for t in pair:
                controls[t.name] = toggle_control(t, pane, info, overrides.get(t.name))
    controls["backend"] = gr.Dropdown(backends, value=backends[0], label="Backend", visible=len(backends) > 1,
                                      elem_id=f"lab-{pane}-backend")
    controls["system"] = gr.Textbox(label="System prompt", lines=1, max_lines=6, placeholder="(none)",
                                    elem_id=f"lab-{pane}-system")
    return [controls[name] for name in FIELDS]
