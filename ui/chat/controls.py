"""One pane's controls, built from the declarations (ui/shell/controls.py makes each one): the sampling
fields and engine toggles, the page's own settings, the backend and the system prompt, returned in
the order of `settings.FIELDS`, whose names the page's scripts use."""

from __future__ import annotations

import gradio as gr

from engine.core.config import FIELD, TOGGLES
from engine.core.info import EngineInfo

from ..shell.controls import toggle_control
from .network import PRESETS
from .settings import FIELDS, ON_PAGE, PAGE_SETTINGS

CHOICE_LABELS = {
    "smoothing": {"off": "off: paint text as it arrives", "adaptive": "adaptive", "pace": "reading pace"},
    "network": {**{name: link.describe() for name, link in PRESETS.items()}, "custom": "custom (the fields below)"},
}


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
                controls[t.name] = toggle_control(t, pane, info, overrides.get(t.name), CHOICE_LABELS.get(t.name))
    controls["backend"] = gr.Dropdown(backends, value=backends[0], label="Backend", visible=len(backends) > 1,
                                      elem_id=f"lab-{pane}-backend")
    controls["system"] = gr.Textbox(label="System prompt", lines=1, max_lines=6, placeholder="(none)",
                                    elem_id=f"lab-{pane}-system")
    return [controls[name] for name in FIELDS]
