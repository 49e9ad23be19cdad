"""The Load tab's open-loop mode: its controls derive from open_run.OPEN_SETTINGS (open_loop.js zips
them with OPEN_FIELDS), its buttons, and the containers open_loop.js and open_plots.js draw into."""

from __future__ import annotations

import gradio as gr

from engine.core.info import EngineInfo

from ..shell.controls import toggle_control
from .open_run import OPEN_FIELDS, OPEN_SETTINGS, PROBE_DEFAULT, batch_choices
from .run import scope_limit

QUICK = {"queue": False, "show_progress": "hidden"}  # browser-side handlers: no round trip of Gradio's

EXPLAIN = (
    "Requests **arrive at a rate** (open loop, as `vllm bench serve --request-rate` sends them), whether or not "
    "the earlier ones have finished, so a server slower than the traffic grows a queue. The rate rises level by "
    "level from a low one until p90 TTFT passes its objective tenfold, goodput falls below half its best, or "
    "*Most levels*; the whole sweep runs once per max batch ticked (a batch scope each, as in closed loop). "
    "**Goodput**: requests per second meeting every objective (vLLM's `--goodput`); the **knee**: the lowest "
    "rate whose goodput is within 5% of the sweep's best. The **probe** (your own prompt) is sent once in the "
    "middle of each level: its bars show what one user waits as load grows. Every reply is judged as in closed "
    "loop. Same sweep from the command line: `python -m server.bench load --request-rate sweep "
    "--compare-max-batch 1,4,8 --goodput ttft:2000 tpot:189`.")


def build(engines: dict, info: EngineInfo) -> None:
    gr.Markdown(EXPLAIN)
    controls = {}
    with gr.Row():
        for t in OPEN_SETTINGS[:7]:
            controls[t.name] = toggle_control(t, "openloop", info)
    with gr.Row():
        for t in OPEN_SETTINGS[7:]:
            controls[t.name] = toggle_control(t, "openloop", info)
        limit = scope_limit(next(iter(engines.values())))
        choices = batch_choices(limit)
        controls["max_batches"] = gr.CheckboxGroup(
            choices, value=[b for b in choices if b in (1, 4, 8)] or choices[:1], label="Max batches (a sweep each)",
            elem_id="lab-openloop-max-batches", visible=bool(choices),
            info="one curve per max batch on the Pareto plot")
    with gr.Row():
        controls["probe"] = gr.Textbox(PROBE_DEFAULT, label="Probe: your prompt, sent once per level", scale=3,
                                       elem_id="lab-openloop-probe", max_lines=3)
        names = list(engines)
        controls["backend"] = gr.Dropdown(names, value=names[0], label="Backend", visible=len(names) > 1, scale=1,
                                          elem_id="lab-openloop-backend",
                                          info="a remote backend batches as its server does: one sweep")
    inputs = [controls[name] for name in OPEN_FIELDS]
    with gr.Row():
        run = gr.Button("Run the sweep", variant="primary", elem_id="lab-openloop-run")
        stop = gr.Button("Stop", variant="stop", elem_id="lab-openloop-stop")
    gr.HTML('<div id="lab-openloop-status" class="lab-muted"></div><div id="lab-openloop-plots"></div>'
            '<p id="lab-openloop-sentence" class="lab-load-sentence"></p><div id="lab-openloop-table"></div>')
    run.click(None, inputs, js="(...a) => { window.lab.openLoop.start(a); }", **QUICK)
    stop.click(None, js="() => { window.lab.openLoop.stop(); }", **QUICK)
