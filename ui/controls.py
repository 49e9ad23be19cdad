"""One pane's controls, built from the declarations: each engine toggle (engine/core/config.py) and
each page setting (ui/settings.py) becomes the control its kind calls for, with its label, help
and bounds. Returned in the order of `settings.FIELDS`, whose names the page's JS uses."""

from __future__ import annotations

import gradio as gr

from engine.core.config import TOGGLES
from engine.core.info import EngineInfo
from engine.core.toggles import Toggle

from . import engine_info
from .network import PRESETS
from .settings import FIELDS, PAGE_SETTINGS

SLIDER_MAX_STEPS = 64  # an int toggle with a wider range gets a number box, not a slider
CHOICE_LABELS = {
    "smoothing": {"off": "off: paint text as it arrives", "adaptive": "adaptive", "pace": "reading pace"},
    "network": {**{name: link.describe() for name, link in PRESETS.items()}, "custom": "custom (the fields below)"},
}


def elem_id(pane: str, name: str) -> str:
    return f"lab-{pane}-{name.replace('_', '-')}"


def toggle_control(t: Toggle, pane: str, info: EngineInfo, value=None):
    """The Gradio control for one declared toggle."""
    value = t.default if value is None else value
    kw = dict(label=t.label, info=t.help, elem_id=elem_id(pane, t.name))
    if t.kind == "bool":
        why = info.unavailable_toggles.get(t.name)  # e.g. no C++ compiler for the compiled step: shown, not offered
        if why:
            return gr.Checkbox(value=False, interactive=False, **{**kw, "info": f"{t.help}. Not on this machine: {why}"})
        note = engine_info.compiled_weights_note(info) if t.name == "compiled_decode" else ""
        return gr.Checkbox(value=value, **{**kw, "info": f"{t.help}. {note}" if note else t.help})
    if t.kind == "int":
        if t.hi is not None and t.lo is not None and t.hi - t.lo <= SLIDER_MAX_STEPS:
            return gr.Slider(t.lo, t.hi, value=value, step=1, **kw)
        return gr.Number(value=value, precision=0, minimum=t.lo, maximum=t.hi, **kw)
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


def settings_controls(pane: str, info: EngineInfo, backends: list[str], *, temperature: float,
                      max_new_tokens: int = 128) -> list:
    """One pane's controls, in the order of settings.FIELDS (the page's JS zips them with those names)."""
    controls = {}
    with gr.Row():
        controls["max_new_tokens"] = gr.Slider(1, 1024, value=max_new_tokens, step=1, label="Max tokens",
                                               elem_id=f"lab-{pane}-max")
        controls["temperature"] = gr.Slider(0, 2, value=temperature, step=0.05, label="Temperature",
                                            info="0 = greedy", elem_id=f"lab-{pane}-temperature")
    with gr.Row():
        controls["top_p"] = gr.Slider(0.05, 1, value=0.9, step=0.05, label="Top-p", elem_id=f"lab-{pane}-top-p")
        controls["seed"] = gr.Number(value=-1, precision=0, label="Seed", info="-1 = random", minimum=-1,
                                     elem_id=f"lab-{pane}-seed")
    declared = [*TOGGLES, *PAGE_SETTINGS]
    for pair in (declared[i:i + 2] for i in range(0, len(declared), 2)):
        with gr.Row():
            for t in pair:
                controls[t.name] = toggle_control(t, pane, info)
    controls["backend"] = gr.Dropdown(backends, value=backends[0], label="Backend", visible=len(backends) > 1,
                                      elem_id=f"lab-{pane}-backend")
    controls["system"] = gr.Textbox(label="System prompt", lines=1, max_lines=6, placeholder="(none)",
                                    elem_id=f"lab-{pane}-system")
    return [controls[name] for name in FIELDS]
