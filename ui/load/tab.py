"""The Load tab's layout: its controls derive from the declarations in run.py (LOAD_SETTINGS);
the plots, the delta table and the sentence are drawn by load.js and load_plots.js."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr

from engine.core.info import EngineInfo

from ..controls import toggle_control
from .run import (
    LOAD_FIELDS,
    LOAD_POOL,
    LOAD_SETTINGS,
    PAGE_MAX_BATCH,
    prompt_set_choices,
    scope_limit,
)

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


def build(engines: dict, info: EngineInfo, prompt_sets: dict, load_ready: bool) -> list:
    """The tab's controls, in the order of run.LOAD_FIELDS (load.js zips them with those names)."""
    limit = scope_limit(next(iter(engines.values()))) or 1
    gr.Markdown(EXPLAIN.format(limit=limit) if load_ready else NO_API)
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
