// Latency Lab's "gradio" token transport: the same request as page.js's SSE stream, sent through
// Gradio's queue instead, to measure what that queue costs (ui/chat/routes.py says why SSE is the default).
(function () {
  "use strict";
  const lab = window.lab;
  const { onEvent } = lab.internal;
  const q = (sel) => document.querySelector(sel);

  // The hidden #lab-gradio-send button's event takes its input from takeGradioPayload() and
  // streams NDJSON lines (the same events as SSE, appended) into a hidden textbox whose change
  // event calls onGradioUpdate. Gradio may coalesce updates: one arrival can carry several events.
  lab.viaGradio = (r, payload) => {
    return new Promise((resolve, reject) => {
      r.gradio = { offset: 0, resolve, reject };
      lab.gradioRun = r;
      lab.pendingGradio = payload;
      q("#lab-gradio-send").click();
    });
  };

  lab.takeGradioPayload = () => {
    const p = lab.pendingGradio;
    lab.pendingGradio = null;
    return [JSON.stringify(p)];
  };

  lab.onGradioUpdate = (value) => {
    const t = performance.now();
    const r = lab.gradioRun;
    if (!r || !r.gradio || typeof value !== "string" || value.length <= r.gradio.offset) return;
    const fresh = value.slice(r.gradio.offset);
    const end = fresh.lastIndexOf("\n");
    if (end < 0) return;
    r.gradio.offset += end + 1;
    try {
      for (const line of fresh.slice(0, end).split("\n")) {
        if (!line) continue;
        const ev = JSON.parse(line);
        onEvent(r, ev.event, ev.data, t);
        if (ev.event === "done") { lab.gradioRun = null; r.gradio.resolve(); }
      }
    } catch (err) {
      lab.gradioRun = null;
      r.gradio.reject(err);
    }
  };

})();
