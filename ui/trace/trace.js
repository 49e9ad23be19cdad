// Latency Lab trace downloads: a "Trace" link under each finished reply (an A/B reply: the pair, both
// panes on one timeline) and `download(session, ids, labels, name)` for the Load tab (every request a
// track). The file is Chrome Trace Event JSON (open it in ui.perfetto.dev or chrome://tracing), built
// by the server from the replies' Timelines and the browser timings the page already sent
// (POST /lab/trace, engine/measure/trace.py). This file only adds what the server cannot know: when the
// browser got the response headers and the stream's first bytes, mapped onto the server clock by the
// same measured offset (docs/trace.md).
import { errorText, postJSON } from "../shell/http.js";

async function fetchTrace(session, ids, labels) {
  await session.ready;
  const r = await postJSON("/lab/trace", { session: session.id, ids, labels: labels || [] });
  if (!r.ok) throw new Error(await errorText(r));
  return r.json();
}

// The page's own stamps (performance.now()) → browser-track instants on the trace's clock. Pure.
export function addPageEvents(trace, runs) {
  const origin = trace.otherData.origin_server_ms;
  for (const r of runs) {
    const m = trace.otherData.replies.find((x) => x.request_id === r.requestId);
    if (!m || m.browser_pid == null || m.clock_offset_ms == null) continue; // unknown: absent
    const args = { clock_offset_ms: m.clock_offset_ms, clock_bound_ms: m.clock_bound_ms };
    for (const [name, t] of [["response headers", r.headersAt], ["first bytes", r.firstByteAt]]) {
      if (t == null) continue;
      trace.traceEvents.push({ name, cat: "browser", ph: "i", s: "t", pid: m.browser_pid, tid: 1,
        ts: Math.round((t + m.clock_offset_ms - origin) * 1e6) / 1e3, args });
    }
  }
  // per track in time order, metadata first (a stable sort keeps parents before children at one ts)
  trace.traceEvents.sort((a, b) => a.pid - b.pid || (a.ph === "M" ? 0 : 1) - (b.ph === "M" ? 0 : 1) || a.ts - b.ts);
  return trace;
}

function save(trace, name) {
  const url = URL.createObjectURL(new Blob([JSON.stringify(trace)], { type: "application/json" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// An A/B reply's partner: the other pane's reply of the same turn (the panes run together).
function pairOf(session, r) {
  if (r.pane !== "A" && r.pane !== "B") return null;
  const i = session.pane(r.pane).runs.indexOf(r);
  const other = session.pane(r.pane === "A" ? "B" : "A").runs[i];
  return other && other.finished && other.requestId && !other.error ? other : null;
}

async function downloadReply(session, r, link) {
  const other = pairOf(session, r);
  const runs = other ? (r.pane === "A" ? [r, other] : [other, r]) : [r];
  const labels = other ? runs.map((x) => x.pane) : [r.pane === "chat" ? "reply" : r.pane];
  try {
    const trace = addPageEvents(await fetchTrace(session, runs.map((x) => x.requestId), labels), runs);
    save(trace, `latency-lab-trace-${other ? "ab-" : ""}${r.requestId}.json`);
  } catch (err) {
    link.textContent = `Trace: ${err.message || err}`;
  }
}

// Under a finished reply: its Trace link (an after-reply hook: the run calls it once the browser timings are in).
export function attach(session, r) {
  if (!r.requestId || r.error || r.view.el.querySelector(".lab-trace")) return;
  const div = document.createElement("div");
  div.className = "lab-trace";
  div.style.cssText = "font-size: 0.76rem; margin: 1px 6px 0;";
  const a = document.createElement("a");
  a.href = "#";
  a.textContent = "Trace";
  a.title = "Download this reply's trace (an A/B reply: both panes on one timeline): browser, network and every server step on one clock. Open it in ui.perfetto.dev.";
  a.addEventListener("click", (e) => { e.preventDefault(); e.stopPropagation(); downloadReply(session, r, a); });
  div.appendChild(a);
  r.view.el.appendChild(div);
}

// For the Load tab: every request of a run on one timeline, one track each.
export async function download(session, ids, labels, name) {
  save(await fetchTrace(session, ids, labels), name || "latency-lab-load-trace.json");
}
