"""The page: a gr.Blocks with the header and the Chat, A/B, Sweep, Load and Glossary tabs, each tab built
by its feature's folder; and the <head>: the page's config, then its scripts.

Gradio draws the controls and runs the sweep. The chat transcripts and live overlays are ours (the
ES modules of ui/chat/ and the other features, wired by ui/entry.js): the buttons' `js` handlers hand
the controls' values to `window.lab`, which streams from /lab/chat.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from engine.core.config import TOGGLES
from server.load.runs import BAD, COMPLETE

from .chat import stress
from .chat import tab as chat_tab
from .chat.records import READING_PACE_TPS
from .chat.settings import FIELDS, PAGE_SETTINGS, SMOOTH_MAX_HOLD_MS
from .chat.store import ChatStore
from .compare import stats
from .compare import tab as compare_tab
from .load import tab as load_tab
from .load.open_run import OPEN_FIELDS
from .load.run import LOAD_FIELDS
from .shell import glossary, glossary_tab, header, static

HERE = Path(__file__).resolve().parent


def head(presets: dict, info, scripts: static.Scripts) -> str:
    """The <head> additions: the page's config (JSON, read by ui/shell/config.js), every module preloaded,
    then the entry module (ui/entry.js), which imports the rest (served from /lab/js/, ui/shell/static.py)."""
    config = {
        "fields": FIELDS,
        "loadFields": LOAD_FIELDS,
        "openLoopFields": OPEN_FIELDS,
        "loadOutcomes": {"complete": list(COMPLETE), "bad": [k for k in BAD if k != "5xx"]},  # the judge's verdicts
        "glossary": glossary.as_json(),
        "presets": {k: {"title": p["title"], "turns": p["turns"],
                        "available": compare_tab.preset_missing(p, info) is None} for k, p in presets.items()},
        "abOrder": list(stats.COUNTERBALANCE),  # which A/B pane runs first, pair by pair (ui/compare/ab.js)
        "abWarmup": stats.WARMUP_PAIRS,
        "readingPace": READING_PACE_TPS,
        "smoothMaxHoldMs": SMOOTH_MAX_HOLD_MS,
        "stress": {"rates": list(stress.RATES), "target_p99_ms": stress.TARGET_P99_MS},  # ui/chat/stress.js
        "emptyChat": chat_tab.EMPTY_CHAT,
        "emptyOverlay": chat_tab.EMPTY_OVERLAY,
    }
    data = json.dumps(config).replace("</", "<\\/")  # a string of it can hold no closing tag
    preload = "".join(f'<link rel="modulepreload" href="{url}">' for url in scripts.urls())
    return (f'<script type="application/json" id="lab-config">{data}</script>{preload}'
            f'<script type="module" src="{scripts.entry}"></script>')


def css() -> str:
    return (HERE / "shell" / "page.css").read_text()


def build_page(store: ChatStore, prompt_sets: dict, presets: dict, load_ready: bool = False) -> gr.Blocks:
    info = store.info
    with gr.Blocks(title="Latency Lab") as page:
        header.build(info)
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat"):
                chat = chat_tab.build(store, info)
            with gr.Tab("A/B", id="ab"):
                ab = compare_tab.build_ab(store, info, presets, chat)
            with gr.Tab("Sweep", id="sweep"):
                compare_tab.build_sweep(store, prompt_sets, ab, tabs)
            with gr.Tab("Load", id="load"):
                load_tab.build(store.engines, info, prompt_sets, load_ready)  # its controls and events
            with gr.Tab("Glossary", id="glossary"):
                glossary_tab.build((*TOGGLES, *PAGE_SETTINGS))
        chat_tab.gradio_transport(store)
        compare_tab.wire_presets(ab, info, presets, chat)
    return page
