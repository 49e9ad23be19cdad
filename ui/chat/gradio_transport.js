// Latency Lab's "gradio" token transport: the same request as the SSE stream, sent through Gradio's
// queue instead, to measure what that queue costs (ui/chat/routes.py says why SSE is the default).
//
// The hidden #lab-gradio-send button's event takes its input from takeGradioPayload() and streams
// NDJSON lines (the same events as SSE, appended) into a hidden textbox whose change event calls
// onGradioUpdate (both wired by ui/chat/tab.py through the entry module). Gradio may coalesce
// updates: one arrival can carry several events. One Gradio run at a time: this module keeps it.
let pending = null; // the payload the hidden button's event takes next
let current = null; // the run streaming through Gradio now: {run, onEvent, offset, resolve, reject}

export function viaGradio(r, payload, onEvent) {
  return new Promise((resolve, reject) => {
    current = { run: r, onEvent, offset: 0, resolve, reject };
    pending = payload;
    document.querySelector("#lab-gradio-send").click();
  });
}

export function takeGradioPayload() {
  const p = pending;
  pending = null;
  return [JSON.stringify(p)];
}

export function onGradioUpdate(value) {
  const t = performance.now();
  const g = current;
  if (!g || typeof value !== "string" || value.length <= g.offset) return;
  const fresh = value.slice(g.offset);
  const end = fresh.lastIndexOf("\n");
  if (end < 0) return;
  g.offset += end + 1;
  try {
    for (const line of fresh.slice(0, end).split("\n")) {
      if (!line) continue;
      const ev = JSON.parse(line);
      g.onEvent(ev.event, ev.data, t);
      if (ev.event === "done") { current = null; g.resolve(); }
    }
  } catch (err) {
    current = null;
    g.reject(err);
  }
}
