"""The A/B and Sweep tabs. A/B: two panes with their own settings, conversations and overlays, one prompt
through both (ui/compare/ab.js runs it in the browser), the teaching presets and the A/A check. Sweep: a
prompt set through the A/B tab's two configs on the server (sweep.py), its verdict, distributions and
exports; also the page's Gradio API `/sweep`."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.core.config import TOGGLES
from engine.core.errors import LatencyLabError
from engine.core.info import EngineInfo

from ..chat.controls import settings_controls
from ..chat.settings import AB_PANE, FIELDS, PAGE_SETTINGS
from ..chat.store import ChatStore
from ..chat.tab import QUICK, ChatTab, exports_html, log_html, overlay_html
from ..shell.presets import custom_prompt_set
from . import stats, sweep

AA_EXPLAIN = ("**A/A check.** Sets B to A's settings and runs the Sweep (its prompt set and items) through both. "
              "Every metric should read *no difference*: that is how to check that this machine and the method are "
              f"quiet enough to trust an A/B. A winner in an A/A check is a false positive (at most {stats.ALPHA:.0%} "
              "of checks, by design); if you see one, use more items or a quieter machine.")


def preset_missing(preset: dict, info: EngineInfo) -> str | None:
    """Why a teaching preset cannot run on this engine (None: it can)."""
    for name, why in info.unavailable_toggles.items():
        if any(preset[side].get(name) for side in ("a", "b")):
            return f"This preset switches on '{name}', which cannot run here: {why}"
    need = preset.get("needs_variant")
    if not need:
        return None
    variant = info.variant(need)
    if variant is None:
        offered = ", ".join(v.name for v in info.variants if v.available) or "none"
        return f"This preset needs the '{need}' weights variant, which this engine does not offer (it offers: {offered})."
    if not variant.available:
        return f"This preset needs the '{need}' weights variant, which cannot run here: {variant.reason}"
    if variant.kernel_fallback:  # it would run, slowly: the lesson would be the fallback's, not the variant's
        return (f"This preset needs our kernels for '{need}', which cannot run here: {variant.kernel_fallback}. "
                f"The variant still runs on the same arithmetic in torch, slower: pick it under Weights to measure it.")
    return None


def preset_settings(preset: dict, side: str, info: EngineInfo) -> dict:
    """A preset pane's full settings: the declared defaults, greedy and short, then the preset's own."""
    chosen = {**{t.name: t.default for t in (*TOGGLES, *PAGE_SETTINGS)}, **AB_PANE, **preset[side]}
    if chosen.get("quantization") is None and info.default_variant:
        chosen["quantization"] = info.default_variant.name  # the dropdown names the loaded variant
    return chosen


@dataclass
class AbTab:
    settings: dict  # "A", "B": each pane's controls, in settings.FIELDS order
    presets: dict  # preset name -> its button
    note: gr.Markdown
    aa_run: gr.Button


def build_ab(store: ChatStore, info: EngineInfo, presets: dict, chat: ChatTab) -> AbTab:
    """The A/B tab's layout and its browser-side events (inside a gr.Tab)."""
    gr.Markdown("Two configs, the same prompt through both (run it again: which pane goes first "
                "alternates); both stream; the overlays share one "
                "time scale. Each pane keeps its own conversation (and prefix-cache scope).")
    with gr.Row():
        buttons = {name: gr.Button(p["title"], size="sm", elem_id=f"lab-preset-{name}") for name, p in presets.items()}
    note = gr.Markdown("")
    with gr.Row(equal_height=False, elem_classes="lab-aa-row"):
        aa_run = gr.Button("A/A check: B = A, run the Sweep", size="sm", scale=0, min_width=240, elem_id="lab-aa-run")
        gr.Markdown(AA_EXPLAIN, elem_id="lab-aa-explain")
    with gr.Row(equal_height=True):
        prompt = gr.Textbox(show_label=False, lines=1, max_lines=6, scale=8, elem_id="lab-ab-msg",
                            placeholder="A prompt for both panes (Enter to run A and B)")
        run = gr.Button("Run A and B", variant="primary", scale=1, elem_id="lab-ab-run")
        stop = gr.Button("Stop", variant="stop", scale=1, elem_id="lab-ab-stop")
        clear = gr.Button("Clear", scale=1, elem_id="lab-ab-clear")
    gr.HTML('<div id="lab-ab-status" class="lab-muted"></div>')
    settings = {}
    with gr.Row(equal_height=False):
        for side in ("A", "B"):
            with gr.Column(min_width=380):
                with gr.Accordion(f"{side} settings", open=False):
                    settings[side] = settings_controls(side, info, list(store.engines), **AB_PANE)
                gr.HTML(log_html(side), elem_id=f"lab-log-{side}")
                gr.HTML(overlay_html(side), elem_id=f"lab-ov-{side}")
    gr.HTML('<h3 class="lab-h">A vs B (latest pair)</h3><div class="lab-delta-wrap lab-muted">'
            'Run a pair to compare.</div>', elem_id="lab-delta")
    with gr.Accordion("Replies in this tab (all panes)", open=False) as table:
        gr.HTML('<div class="lab-table-wrap"></div>' + exports_html(None, "Export"), elem_id="lab-table-A")

    table.expand(None, js="() => { setTimeout(() => window.lab.refreshTable('A'), 0); }", **QUICK)
    inputs = [prompt, *settings["A"], *settings["B"], chat.transport, chat.pace]
    run.click(None, inputs, [prompt], js="(...a) => window.lab.runAB(a)", **QUICK)
    prompt.submit(None, inputs, [prompt], js="(...a) => window.lab.runAB(a)", **QUICK)
    stop.click(None, js="() => { window.lab.stopAB(); }", **QUICK)
    clear.click(None, js="() => { window.lab.clear('A'); window.lab.clear('B'); }", **QUICK)
    return AbTab(settings, buttons, note, aa_run)


def wire_presets(ab: AbTab, info: EngineInfo, presets: dict, chat: ChatTab) -> None:
    """Each preset button: the server sets both panes' controls (or says why it cannot run), then the page runs it."""

    def preset_values(name: str):
        p = presets[name]
        missing = preset_missing(p, info)
        if missing:  # leave the controls alone; the page's JS does not run it either
            return [gr.update() for _ in range(2 * len(FIELDS))] + [f"**{p['title']}.** {missing}"]
        updates = []
        for side in ("a", "b"):
            chosen = preset_settings(p, side, info)
            updates += [gr.update(value=chosen[f]) if f in chosen else gr.update() for f in FIELDS]
        return [*updates, f"**{p['title']}.** {p['explain']}"]

    both = [*ab.settings["A"], *ab.settings["B"]]
    for name, button in ab.presets.items():
        button.click(lambda n=name: preset_values(n), None, [*both, ab.note], queue=False,
                     show_progress="hidden", api_visibility="private").then(
            None, [*both, chat.transport], js=f"(...a) => {{ window.lab.runPreset('{name}', a); }}", **QUICK)


def build_sweep(store: ChatStore, prompt_sets: dict, ab: AbTab, tabs: gr.Tabs) -> None:
    """The Sweep tab's layout and events (inside a gr.Tab), the A/B tab's A/A button, and the `/sweep` API."""
    decode = store.decoder()  # token ids → text, for where two replies part
    gr.Markdown("Runs a prompt set through the **A and B settings of the A/B tab**, item by item, which "
                "config runs first alternating (AB, BA, BA, AB, …) after a warm-up pair that is not "
                "counted; then a verdict with a 95% interval per metric, p50/p90 and distributions. "
                "Figures are the server's (browser-perceived ones need a page streaming each reply: Chat, "
                "A/B), so the panes' *Network*, *Streaming* and smoothing settings do not apply here.")
    with gr.Row():
        set_choice = gr.Radio([(s["title"], k) for k, s in prompt_sets.items()] + [("My own prompts", "custom")],
                              value=next(iter(prompt_sets)), label="Prompt set", scale=3)
        max_items = gr.Slider(1, 50, value=4, step=1, label="Items (conversations)", scale=1,
                              elem_id="lab-sweep-items")
    custom = gr.Textbox(label="My own prompts (one per line)", lines=4, max_lines=12)
    with gr.Row():
        run = gr.Button("Run sweep", variant="primary", elem_id="lab-sweep-run")
        stop = gr.Button("Stop", variant="stop")
    summary = gr.HTML(elem_id="lab-sweep-summary")
    plot = gr.Plot(label="Distributions (every reply a point)", show_label=False)
    files = gr.File(label="Export (CSV, JSON)", file_count="multiple")

    async def run_sweep_event(set_name, custom, max_items, *values, progress=gr.Progress()):
        n = len(FIELDS)
        try:
            prompt_set = custom_prompt_set(custom) if set_name == "custom" else prompt_sets[set_name]
            rows = await sweep.run_sweep(store, prompt_set, dict(zip(FIELDS, values[:n])),
                                         dict(zip(FIELDS, values[n:2 * n])), max_items=int(max_items),
                                         progress=lambda d, t, desc: progress((d, t), desc=desc, unit="replies"))
        except LatencyLabError as exc:
            raise gr.Error(str(exc)) from exc
        return sweep.summary_html(rows, decode), sweep.distributions_figure(rows), sweep.export_files(rows)

    async def sweep_api(prompt_set: str = "open_questions", prompts: str = "", settings_a: dict | None = None,
                        settings_b: dict | None = None, max_items: int = 4) -> dict:
        """Run a prompt set (a preset name, or "custom" with `prompts`, one per line) through
        settings A and B, counterbalanced after a warm-up pair; returns {"summary": p50/p90 per metric,
        "paired": B/A with its 95% interval and decision per metric, "replies": identical replies,
        "verdict": one sentence, "aa", "design", "decision": how it ran and decided, "rows": one per
        reply, with its order}."""
        try:
            chosen = custom_prompt_set(prompts) if prompt_set == "custom" else prompt_sets.get(prompt_set)
            if chosen is None:
                raise LatencyLabError(f"prompt_set must be one of {', '.join(prompt_sets)} or custom")
            rows = await sweep.run_sweep(store, chosen, settings_a or {}, settings_b or {}, max_items=max_items)
        except LatencyLabError as exc:
            raise gr.Error(str(exc)) from exc
        return {**sweep.report(rows, decode), "rows": rows}

    both = [*ab.settings["A"], *ab.settings["B"]]
    inputs, outputs = [set_choice, custom, max_items, *both], [summary, plot, files]
    event = run.click(run_sweep_event, inputs, outputs, api_visibility="private")
    # A/A: B's controls take A's values, the Sweep tab opens, and the sweep runs (its set and items)
    aa_event = ab.aa_run.click(lambda *v: [*v, gr.Tabs(selected="sweep")], ab.settings["A"],
                               [*ab.settings["B"], tabs], queue=False, show_progress="hidden",
                               api_visibility="private").then(run_sweep_event, inputs, outputs,
                                                              api_visibility="private")
    stop.click(None, cancels=[event, aa_event], **QUICK)
    gr.api(sweep_api, api_name="sweep")
