"""The Chat tab: the transcript, the message box and its buttons, the pane's settings, the token
transport and the reading pace, the overlays beside them, and the table of this tab's replies; plus
the hidden controls of the "gradio" transport, whose `/chat` endpoint is also the page's Gradio API.

The buttons run in the browser (their `js` handlers, wired by ui/entry.js): no round trip of Gradio's."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import gradio as gr

from engine.core.errors import LatencyLabError
from engine.core.info import EngineInfo

from . import stress
from .controls import settings_controls
from .records import READING_PACE_TPS
from .settings import CHAT_PANE
from .store import ChatStore

EMPTY_CHAT = "Send a message: the reply streams here, and the overlays on the right show where its time went."
EMPTY_OVERLAY = "The overlays of the selected reply appear here, live while it streams. Click a reply to see its own."
EMPTY_PANE = "This pane's conversation is empty."
TRANSPORTS = [("our SSE stream (default)", "sse"), ("Gradio's queue (to compare)", "gradio")]
STRESS_TITLE = "Stress run: this browser's paint limit"
STRESS_NOTE = (f"The stress run streams a long markdown reply (~{stress.REPLY_TOKENS:,} tokens: code blocks, lists, "
               f"tables) from a paced test source at {', '.join(f'{r:,}' for r in stress.RATES)} tok/s (at most "
               f"{stress.MAX_SECONDS:g} s each) and measures what this page does with it: paint lag, long tasks, render "
               f"cost per update (markdown vs DOM), dropped frames. It clears this chat.")
QUICK = dict(queue=False, show_progress="hidden")  # browser-side handlers: no round trip of Gradio's


def log_html(pane: str) -> str:
    text = EMPTY_CHAT if pane == "chat" else EMPTY_PANE
    return f'<div class="lab-log" data-pane="{pane}"><div class="lab-empty">{html.escape(text)}</div></div>'


def overlay_html(pane: str) -> str:
    return f'<div class="lab-ov" data-pane="{pane}"><div class="lab-empty">{html.escape(EMPTY_OVERLAY)}</div></div>'


def exports_html(pane: str | None, label: str) -> str:
    attr = f' data-pane="{pane}"' if pane else ""
    return (f'<div class="lab-exports">{html.escape(label)}: '
            f'<a class="lab-export" data-fmt="csv"{attr} href="#" download>CSV</a> · '
            f'<a class="lab-export" data-fmt="json"{attr} href="#" download>JSON</a></div>')


@dataclass
class ChatTab:
    settings: list  # the pane's controls, in settings.FIELDS order
    transport: gr.Radio
    pace: gr.Slider


def build(store: ChatStore, info: EngineInfo) -> ChatTab:
    """The tab's layout and its events (inside a gr.Tab)."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=420):
            gr.HTML(log_html("chat"), elem_id="lab-log-chat")
            with gr.Row(equal_height=True):
                msg = gr.Textbox(show_label=False, lines=1, max_lines=8, scale=8, elem_id="lab-msg",
                                 placeholder="Message (Enter to send, Shift+Enter for a new line)", autofocus=True)
                with gr.Column(scale=1, min_width=96):
                    send = gr.Button("Send", variant="primary", elem_id="lab-send")
                    stop = gr.Button("Stop", variant="stop", elem_id="lab-stop")
            with gr.Row():
                regen = gr.Button("Regenerate", size="sm", elem_id="lab-regen")
                clear = gr.Button("Clear", size="sm", elem_id="lab-clear")
                stress_btn = gr.Button(STRESS_TITLE, size="sm", elem_id="lab-stress-run")
            gr.HTML(f'<div class="lab-stress-note lab-muted">{html.escape(STRESS_NOTE)}</div>'
                    '<div class="lab-stress-out"></div>', elem_id="lab-stress")
            with gr.Accordion("Settings", open=True):
                settings = settings_controls("chat", info, list(store.engines), **CHAT_PANE)
                with gr.Row():
                    transport = gr.Radio(TRANSPORTS, value="sse", label="Token transport",
                                         info="how tokens reach this page", elem_id="lab-transport")
                    pace = gr.Slider(2, 12, value=READING_PACE_TPS, step=0.1, label="Reading pace (tok/s)",
                                     info="the dashed line: ~238 words/min silent reading")
        with gr.Column(scale=4, min_width=380):
            gr.HTML(overlay_html("chat"), elem_id="lab-ov-chat")
    with gr.Accordion("Replies in this tab", open=False) as table:
        gr.HTML('<div class="lab-table-wrap"></div>' + exports_html("chat", "Export this tab's chat"),
                elem_id="lab-table-chat")

    inputs = [msg, *settings, transport, pace]
    send.click(None, inputs, [msg], js="(...a) => window.lab.sendChat(a)", **QUICK)
    msg.submit(None, inputs, [msg], js="(...a) => window.lab.sendChat(a)", **QUICK)
    stop.click(None, js="() => { window.lab.stop('chat'); }", **QUICK)
    regen.click(None, [*settings, transport], js="(...a) => { window.lab.regenerate('chat', a); }", **QUICK)
    clear.click(None, js="() => { window.lab.clear('chat'); }", **QUICK)
    stress_btn.click(None, js="() => { window.lab.stress(); }", **QUICK)
    # a closed accordion's content is not in the page: fill the table when it opens
    table.expand(None, js="() => { setTimeout(() => window.lab.refreshTable('chat'), 0); }", **QUICK)
    return ChatTab(settings, transport, pace)


def gradio_transport(store: ChatStore) -> None:
    """The "gradio" transport: hidden controls the page's scripts drive (takeGradioPayload, onGradioUpdate);
    its event is the page's Gradio API `/chat`."""

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

    payload = gr.Textbox(visible="hidden", elem_id="lab-gradio-payload")
    stream = gr.Textbox(visible="hidden", elem_id="lab-gradio-stream")
    send = gr.Button("gradio send", visible="hidden", elem_id="lab-gradio-send")
    send.click(gradio_chat, [payload], [stream], js="() => window.lab.takeGradioPayload()",
               api_name="chat", concurrency_limit=None, show_progress="hidden")
    stream.change(None, [stream], js="(v) => { window.lab.onGradioUpdate(v); }", **QUICK)
