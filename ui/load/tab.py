"""The Load tab's layout and events: the mode (closed loop: N clients, two runs; open loop: a rate
sweep), each mode's controls derived from its declarations (run.py LOAD_SETTINGS, open_run.py
OPEN_SETTINGS), its buttons and the containers its scripts draw into (closed: load.js and
load_plots.js; open: open_loop.js and open_plots.js)."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from engine.core.info import EngineInfo

from ..shell.controls import toggle_control
from . import open_tab
from .run import LOAD_FIELDS, LOAD_POOL, LOAD_SETTINGS, PAGE_MAX_BATCH, prompt_set_choices, scope_limit

EXPLAIN = (
    "N simulated clients send requests through this server's own API (HTTP on loopback, as "
    "`python -m server.bench load` does), so every figure is the server's `timings`. Two runs, one after "
    "the other, differ only in **max batch**: each run has a limit of its own (a *batch scope* on the "
    "engine) — at most that many of the run's requests decode together — while other sessions' chats keep "
    "the engine's limit (`--max-batch`, {limit} here) and keep working, sharing the machine and the batch with "
    "the run. Every reply is judged against the same request alone (computed first): nothing may be lost, "
    "crossed with another's, mismatched or stuck. Where the server does not promise exact replies (bf16 or "
    "quantized weights, a remote server), a reply unlike its reference but nobody else's *differs*: a batch "
    "or a cached prefix may round a near-tie the other way; it is counted, not a failure.")
NO_API = "This server has no API mounted (/v1): start the page with `python app.py` to run loads."


MODES = [("Closed loop: N clients, two runs side by side", "closed"),
         ("Open loop: requests arrive at a rate, swept up to saturation", "open")]
QUICK = {"queue": False, "show_progress": "hidden"}


def build(engines: dict, info: EngineInfo, prompt_sets: dict, load_ready: bool) -> None:
    """The whole tab: the mode, then each mode's controls, buttons and output, its events wired."""
    if not load_ready:
        gr.Markdown(NO_API)
    mode = gr.Radio(MODES, value="closed", label="Mode", elem_id="lab-load-mode",
                    info="closed loop: each client waits for its reply before it sends again, so the load eases as "
                         "the server slows; open loop: requests arrive on their own, as real traffic does")
    with gr.Column(visible=True) as closed:
        inputs = build_closed(engines, info, prompt_sets)
        with gr.Row():
            run = gr.Button("Run both (run 1, then run 2)", variant="primary", elem_id="lab-load-run")
            stop = gr.Button("Stop", variant="stop", elem_id="lab-load-stop")
        gr.HTML('<div id="lab-load-status" class="lab-muted"></div><div id="lab-load-plots"></div>'
                '<p id="lab-load-sentence" class="lab-load-sentence"></p><div id="lab-load-delta"></div>'
                '<div id="lab-load-reuse"></div>'
                '<div id="lab-load-trace" class="lab-trace"></div>')
    with gr.Column(visible=False) as open_:
        open_tab.build(engines, info)
    run.click(None, inputs, js="(...a) => { window.lab.load.start(a); }", **QUICK)
    stop.click(None, js="() => { window.lab.load.stop(); }", **QUICK)
    mode.change(lambda m: (gr.update(visible=m == "closed"), gr.update(visible=m == "open")), [mode],
                [closed, open_], **QUICK)


def build_closed(engines: dict, info: EngineInfo, prompt_sets: dict) -> list:
    """The closed-loop controls, in the order of run.LOAD_FIELDS (load.js zips them with those names)."""
    limit = scope_limit(next(iter(engines.values()))) or 1
    gr.Markdown(EXPLAIN.format(limit=limit))
    if limit == 1:
        gr.Markdown(f"**This engine runs one request at a time** (started with `--max-batch 1`): both runs can only "
                    f"use max batch 1. Restart with `--max-batch {PAGE_MAX_BATCH}` to compare.")
    controls = {}
    with gr.Row():
        for t in LOAD_SETTINGS:
            if t.name.startswith("max_batch"):
                t = replace(t, hi=max(2, limit), default=min(t.default, limit))
            controls[t.name] = toggle_control(t, "load", info)
    titles = {LOAD_POOL: "the load bench's two-turn chats (KV reuse on/off, sessions, seeded sampling)"}
    choices = [(titles.get(k) or prompt_sets[k]["title"], k) for k in prompt_set_choices(prompt_sets)]
    with gr.Row():
        controls["prompt_set"] = gr.Dropdown(choices, value=LOAD_POOL, label="Prompt set", scale=3,
                                             elem_id="lab-load-prompt-set",
                                             info="greedy, no speculation: those requests would run beside the batch")
        names = list(engines)
        controls["backend"] = gr.Dropdown(names, value=names[0], label="Backend", visible=len(names) > 1, scale=1,
                                          elem_id="lab-load-backend",
                                          info="a remote backend batches as its server does (max batch: —)")
    return [controls[name] for name in LOAD_FIELDS]
