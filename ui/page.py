"""The page: a gr.Blocks with Chat, A/B, Sweep, Load and Glossary tabs.

Gradio draws the controls and runs the sweep. The chat transcripts and live overlays are
ours (ui/page.js, ui/overlays.js, ui/client_timing.js, loaded into the page's <head>): the
buttons' `js` handlers hand the controls' values to `window.lab`, which streams from /lab/chat.
`gradio_chat` is the same turn through Gradio's queue: the page's "gradio" transport, and the
`/chat` endpoint of the page's Gradio API.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr

from engine.core.config import TOGGLES
from engine.core.errors import LatencyLabError
from engine.core.info import EngineInfo
from server.load.figures import BAD, COMPLETE

from . import engine_info, glossary, stats, sweep
from .chat import ChatStore
from .controls import settings_controls
from .load import tab as load_tab
from .load.open_run import OPEN_FIELDS
from .load.run import LOAD_FIELDS
from .presets import custom_prompt_set
from .records import READING_PACE_TPS
from .settings import AB_PANE, CHAT_PANE, FIELDS, PAGE_SETTINGS, SMOOTH_MAX_HOLD_MS

HERE = Path(__file__).resolve().parent
EMPTY_CHAT = "Send a message: the reply streams here, and the overlays on the right show where its time went."
EMPTY_OVERLAY = "The overlays of the selected reply appear here, live while it streams. Click a reply to see its own."
TRANSPORTS = [("our SSE stream (default)", "sse"), ("Gradio's queue (to compare)", "gradio")]
AA_EXPLAIN = ("**A/A check.** Sets B to A's settings and runs the Sweep (its prompt set and items) through both. "
              "Every metric should read *no difference*: that is how to check that this machine and the method are "
              f"quiet enough to trust an A/B. A winner in an A/A check is a false positive (at most {stats.ALPHA:.0%} "
              "of checks, by design); if you see one, use more items or a quieter machine.")
LIMITS_HOVER = ("Measured on this machine at first start (engine/measure/machine_limits.py), best of interleaved "
                "rounds: memory read bandwidth (a sum over a buffer far past the caches), copy bandwidth (for "
                "reference) and matmul throughput per dtype. Each reply's prefill is shown against the matmul "
                "peak, its decode against the read bandwidth.")


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
    return None


def preset_settings(preset: dict, side: str, info: EngineInfo) -> dict:
    """A preset pane's full settings: the declared defaults, greedy and short, then the preset's own."""
    chosen = {**{t.name: t.default for t in (*TOGGLES, *PAGE_SETTINGS)}, **AB_PANE, **preset[side]}
    if chosen.get("quantization") is None and info.default_variant:
        chosen["quantization"] = info.default_variant.name  # the dropdown names the loaded variant
    return chosen


def head(presets: dict, info: EngineInfo) -> str:
    """The <head> additions: the page's config, then our scripts (inlined: one request less)."""
    config = {
        "fields": FIELDS,
        "loadFields": LOAD_FIELDS,
        "openLoopFields": OPEN_FIELDS,
        "loadOutcomes": {"complete": list(COMPLETE), "bad": [k for k in BAD if k != "5xx"]},  # the judge's verdicts
        "glossary": glossary.as_json(),
        "presets": {k: {"title": p["title"], "turns": p["turns"], "available": preset_missing(p, info) is None}
                    for k, p in presets.items()},
        "abOrder": list(stats.COUNTERBALANCE),  # which A/B pane runs first, pair by pair (ui/ab.js)
        "abWarmup": stats.WARMUP_PAIRS,
        "readingPace": READING_PACE_TPS,
        "smoothMaxHoldMs": SMOOTH_MAX_HOLD_MS,
        "emptyChat": EMPTY_CHAT,
        "emptyOverlay": EMPTY_OVERLAY,
    }
    scripts = [f"window.LAB_CONFIG = {json.dumps(config)};"] + [
        (HERE / name).read_text() for name in ("overlays.js", "roofline.js", "markdown.js", "client_timing.js",
                                              "smooth.js", "page.js", "sse_transport.js", "trace.js",
                                              "gradio_transport.js", "ab.js", "replay.js", "whatif.js",
                                              "load/load_plots.js", "load/load.js", "load/open_plots.js",
                                              "load/open_loop.js")]
    return "".join(f"<script>{s.replace('</', '<' + chr(92) + '/')}</script>" for s in scripts)


def css() -> str:
    return (HERE / "page.css").read_text()


def _log(pane: str) -> str:
    text = EMPTY_CHAT if pane == "chat" else "This pane's conversation is empty."
    return f'<div class="lab-log" data-pane="{pane}"><div class="lab-empty">{html.escape(text)}</div></div>'


def _overlay(pane: str) -> str:
    return f'<div class="lab-ov" data-pane="{pane}"><div class="lab-empty">{html.escape(EMPTY_OVERLAY)}</div></div>'


def _exports(pane: str | None, label: str) -> str:
    attr = f' data-pane="{pane}"' if pane else ""
    return (f'<div class="lab-exports">{html.escape(label)}: '
            f'<a class="lab-export" data-fmt="csv"{attr} href="#" download>CSV</a> · '
            f'<a class="lab-export" data-fmt="json"{attr} href="#" download>JSON</a></div>')


def glossary_html() -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(m.name)}</code></td><td>{html.escape(m.label)}</td><td>{html.escape(m.unit)}</td>"
        f"<td>{html.escape(m.start or '—')}</td><td>{html.escape(m.end)}</td><td>{html.escape(m.clock)}</td></tr>"
        for m in glossary.METRICS.values())
    return ('<table class="lab-table lab-glossary"><thead><tr><th>name</th><th>shown as</th><th>unit</th>'
            f"<th>start event</th><th>end event</th><th>clock</th></tr></thead><tbody>{rows}</tbody></table>")


def settings_glossary_html() -> str:
    """Every setting of a pane, from its declaration: what it does and the metric it moves."""
    rows = "".join(
        f"<tr><td><code>{html.escape(t.name)}</code></td><td>{html.escape(t.label)}</td>"
        f"<td>{html.escape(str(t.default))}</td><td>{html.escape(t.help)}</td>"
        f"<td>{'<code>' + html.escape(t.glossary) + '</code>' if t.glossary else '—'}</td>"
        f"<td>{html.escape(', '.join(t.backends))}</td></tr>"
        for t in (*TOGGLES, *PAGE_SETTINGS))
    return ('<table class="lab-table lab-glossary"><thead><tr><th>setting</th><th>control</th><th>default</th>'
            f"<th>what it does</th><th>moves</th><th>honoured by</th></tr></thead><tbody>{rows}</tbody></table>")


def build_page(store: ChatStore, prompt_sets: dict, presets: dict, load_ready: bool = False) -> gr.Blocks:
    info = store.info
    backends = list(store.engines)
    decode = sweep.decoder(store)  # token ids → text, for where two replies part

    async def gradio_chat(payload: str):
        """One turn through Gradio's queue. `payload`: JSON {session?, pane, message, settings,
        regenerate}. Streams NDJSON: one line per event ({"event", "data"}), appended."""
        out = ""
        try:
            body = json.loads(payload or "{}")
            if not isinstance(body, dict):
                raise ValueError("the payload must be a JSON object")
            session = body.get("session") or store.new_session()
            async for kind, data in store.run_turn(session, body.get("pane", "chat"), body.get("message"),
                                                   body.get("settings") or {},
                                                   regenerate=bool(body.get("regenerate"))):
                if kind == "start":
                    data = {**data, "session": session}
                out += json.dumps({"event": kind, "data": data}) + "\n"
                yield out
        except (LatencyLabError, ValueError) as exc:
            out += json.dumps({"event": "error", "data": {"message": str(exc)}}) + "\n"
            yield out

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

    with gr.Blocks(title="Latency Lab") as page:
        gr.HTML(f'<div class="lab-header"><div><h1>Latency Lab</h1><span class="lab-sub">where an LLM reply\'s time '
                f'goes: measured by the server, perceived by your browser</span></div><div class="lab-engine">'
                f'{html.escape(info.headline())}<br><span id="lab-limits" title="{html.escape(LIMITS_HOVER)}">'
                f'{html.escape(engine_info.limits_line(info))}</span> <button id="lab-limits-rerun" type="button" '
                f'class="lab-linkbtn">re-measure</button> · <a id="lab-report-link" href="/lab/report.html" target="_blank" '
                f'title="the newest `latency-lab report` of this machine: limits, decode per weights variant, KV reuse, '
                f'prompt lookup, batching">latest report</a><br><span id="lab-machine" class="lab-muted">'
                f'{html.escape((info.capabilities or {}).get("summary") or "")}</span><br>'
                f'<span id="lab-clock">clock offset: measuring…</span>'
                f'</div></div>')
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5, min_width=420):
                        gr.HTML(_log("chat"), elem_id="lab-log-chat")
                        with gr.Row(equal_height=True):
                            msg = gr.Textbox(show_label=False, lines=1, max_lines=8, scale=8, elem_id="lab-msg",
                                             placeholder="Message (Enter to send, Shift+Enter for a new line)",
                                             autofocus=True)
                            with gr.Column(scale=1, min_width=96):
                                send = gr.Button("Send", variant="primary", elem_id="lab-send")
                                stop = gr.Button("Stop", variant="stop", elem_id="lab-stop")
                        with gr.Row():
                            regen = gr.Button("Regenerate", size="sm", elem_id="lab-regen")
                            clear = gr.Button("Clear", size="sm", elem_id="lab-clear")
                        with gr.Accordion("Settings", open=True):
                            chat_settings = settings_controls("chat", info, backends, **CHAT_PANE)
                            with gr.Row():
                                transport = gr.Radio(TRANSPORTS, value="sse", label="Token transport",
                                                     info="how tokens reach this page", elem_id="lab-transport")
                                pace = gr.Slider(2, 12, value=READING_PACE_TPS, step=0.1,
                                                 label="Reading pace (tok/s)",
                                                 info="the dashed line: ~238 words/min silent reading")
                    with gr.Column(scale=4, min_width=380):
                        gr.HTML(_overlay("chat"), elem_id="lab-ov-chat")
                with gr.Accordion("Replies in this tab", open=False) as chat_table:
                    gr.HTML('<div class="lab-table-wrap"></div>' + _exports("chat", "Export this tab's chat"),
                            elem_id="lab-table-chat")

            with gr.Tab("A/B", id="ab"):
                gr.Markdown("Two configs, the same prompt through both (run it again: which pane goes first "
                            "alternates); both stream; the overlays share one "
                            "time scale. Each pane keeps its own conversation (and prefix-cache scope).")
                with gr.Row():
                    preset_buttons = {name: gr.Button(p["title"], size="sm", elem_id=f"lab-preset-{name}")
                                      for name, p in presets.items()}
                preset_note = gr.Markdown("")
                with gr.Row(equal_height=False, elem_classes="lab-aa-row"):
                    aa_run = gr.Button("A/A check: B = A, run the Sweep", size="sm", scale=0, min_width=240,
                                       elem_id="lab-aa-run")
                    gr.Markdown(AA_EXPLAIN, elem_id="lab-aa-explain")
                with gr.Row(equal_height=True):
                    ab_prompt = gr.Textbox(show_label=False, lines=1, max_lines=6, scale=8, elem_id="lab-ab-msg",
                                           placeholder="A prompt for both panes (Enter to run A and B)")
                    ab_run = gr.Button("Run A and B", variant="primary", scale=1, elem_id="lab-ab-run")
                    ab_stop = gr.Button("Stop", variant="stop", scale=1, elem_id="lab-ab-stop")
                    ab_clear = gr.Button("Clear", scale=1, elem_id="lab-ab-clear")
                gr.HTML('<div id="lab-ab-status" class="lab-muted"></div>')
                ab_settings = {}
                with gr.Row(equal_height=False):
                    for side in ("A", "B"):
                        with gr.Column(min_width=380):
                            with gr.Accordion(f"{side} settings", open=False):
                                ab_settings[side] = settings_controls(side, info, backends, **AB_PANE)
                            gr.HTML(_log(side), elem_id=f"lab-log-{side}")
                            gr.HTML(_overlay(side), elem_id=f"lab-ov-{side}")
                gr.HTML('<h3 class="lab-h">A vs B (latest pair)</h3><div class="lab-delta-wrap lab-muted">'
                        'Run a pair to compare.</div>', elem_id="lab-delta")
                with gr.Accordion("Replies in this tab (all panes)", open=False) as ab_table:
                    gr.HTML('<div class="lab-table-wrap"></div>' + _exports(None, "Export"), elem_id="lab-table-A")

            with gr.Tab("Sweep", id="sweep"):
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
                    sweep_run = gr.Button("Run sweep", variant="primary", elem_id="lab-sweep-run")
                    sweep_stop = gr.Button("Stop", variant="stop")
                sweep_summary = gr.HTML(elem_id="lab-sweep-summary")
                sweep_plot = gr.Plot(label="Distributions (every reply a point)", show_label=False)
                sweep_files = gr.File(label="Export (CSV, JSON)", file_count="multiple")

            with gr.Tab("Load", id="load"):
                load_tab.build(store.engines, info, prompt_sets, load_ready)  # its controls and events

            with gr.Tab("Glossary", id="glossary"):
                gr.Markdown("Every number on the page, with the events it starts and ends at. Hover a number "
                            "anywhere to see its definition.")
                gr.HTML(glossary_html())
                gr.Markdown("### Settings\nEach pane's settings, as declared once in the code (`engine/core/config.py`, "
                            "`ui/settings.py`). *Network* is simulated on the page's own transport; the server's "
                            "figures stay the engine's.")
                gr.HTML(settings_glossary_html())

        # The Gradio transport: hidden, driven by page.js (see lab.takeGradioPayload / onGradioUpdate).
        gr_payload = gr.Textbox(visible="hidden", elem_id="lab-gradio-payload")
        gr_stream = gr.Textbox(visible="hidden", elem_id="lab-gradio-stream")
        gr_send = gr.Button("gradio send", visible="hidden", elem_id="lab-gradio-send")

        # --- events: browser-side handlers for the chat and A/B (no server round trip of Gradio's) --
        quick = dict(queue=False, show_progress="hidden")
        chat_inputs = [msg, *chat_settings, transport, pace]
        send.click(None, chat_inputs, [msg], js="(...a) => window.lab.sendChat(a)", **quick)
        msg.submit(None, chat_inputs, [msg], js="(...a) => window.lab.sendChat(a)", **quick)
        stop.click(None, js="() => { window.lab.stop('chat'); }", **quick)
        regen.click(None, [*chat_settings, transport], js="(...a) => { window.lab.regenerate('chat', a); }", **quick)
        clear.click(None, js="() => { window.lab.clear('chat'); }", **quick)
        # a closed accordion's content is not in the page: fill the table when it opens
        chat_table.expand(None, js="() => { setTimeout(() => window.lab.refreshTable('chat'), 0); }", **quick)
        ab_table.expand(None, js="() => { setTimeout(() => window.lab.refreshTable('A'), 0); }", **quick)

        ab_inputs = [ab_prompt, *ab_settings["A"], *ab_settings["B"], transport, pace]
        ab_run.click(None, ab_inputs, [ab_prompt], js="(...a) => window.lab.runAB(a)", **quick)
        ab_prompt.submit(None, ab_inputs, [ab_prompt], js="(...a) => window.lab.runAB(a)", **quick)
        ab_stop.click(None, js="() => { window.lab.stopAB(); }", **quick)
        ab_clear.click(None, js="() => { window.lab.clear('A'); window.lab.clear('B'); }", **quick)
        both = [*ab_settings["A"], *ab_settings["B"]]
        for name, button in preset_buttons.items():
            button.click(lambda n=name: preset_values(n), None, [*both, preset_note], queue=False,
                         show_progress="hidden", api_visibility="private").then(
                None, [*both, transport], js=f"(...a) => {{ window.lab.runPreset('{name}', a); }}", **quick)

        gr_send.click(gradio_chat, [gr_payload], [gr_stream], js="() => window.lab.takeGradioPayload()",
                      api_name="chat", concurrency_limit=None, show_progress="hidden")
        gr_stream.change(None, [gr_stream], js="(v) => { window.lab.onGradioUpdate(v); }", **quick)


        sweep_event = sweep_run.click(run_sweep_event, [set_choice, custom, max_items, *both],
                                      [sweep_summary, sweep_plot, sweep_files], api_visibility="private")
        # A/A: B's controls take A's values, the Sweep tab opens, and the sweep runs (its set and items)
        aa_event = aa_run.click(lambda *v: [*v, gr.Tabs(selected="sweep")], ab_settings["A"],
                                [*ab_settings["B"], tabs], queue=False, show_progress="hidden",
                                api_visibility="private").then(
            run_sweep_event, [set_choice, custom, max_items, *both], [sweep_summary, sweep_plot, sweep_files],
            api_visibility="private")
        sweep_stop.click(None, cancels=[sweep_event, aa_event], **quick)
        gr.api(sweep_api, api_name="sweep")
    return page
