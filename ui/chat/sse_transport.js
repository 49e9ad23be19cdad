// Latency Lab's default token transport: the page's POST /lab/chat read as a Server-Sent Events stream,
// every event stamped with the time its bytes arrived (ui/chat/gradio_transport.js is the other one).
import { errorText, postJSON } from "../shell/http.js";

// One SSE frame's event name and data (the spec's lines; a comment line is skipped). Pure.
export function parseFrame(frame) {
  let event = "message";
  const data = [];
  for (const line of frame.split(/\r\n|\r|\n/)) {
    if (!line || line[0] === ":") continue;
    const i = line.indexOf(":");
    const key = i < 0 ? line : line.slice(0, i);
    let val = i < 0 ? "" : line.slice(i + 1);
    if (val[0] === " ") val = val.slice(1);
    if (key === "event") event = val;
    else if (key === "data") data.push(val);
  }
  return { event, data: data.join("\n") };
}

// r: the run; onEvent(kind, data, t): each event, t when its bytes arrived.
export async function viaSSE(r, payload, onEvent) {
  const resp = await postJSON("/lab/chat", payload);
  r.headersAt = performance.now(); // the response headers are in (the trace's browser track, ui/trace/trace.js)
  if (!resp.ok) throw new Error(await errorText(resp));
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    const t = performance.now(); // every event in this read arrived now
    if (done) break;
    r.firstByteAt ??= t;
    buf += decoder.decode(value, { stream: true });
    let m;
    while ((m = /\r\n\r\n|\n\n|\r\r/.exec(buf))) {
      const frame = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const ev = parseFrame(frame);
      if (ev.data) onEvent(ev.event, JSON.parse(ev.data), t);
    }
  }
  if (!r.finished && !r.error && !r.row) throw new Error("the stream ended without a reply");
}
