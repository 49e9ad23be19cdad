// Latency Lab Load tab, closed loop: a pair of load runs (POST /lab/load/start), polled while it runs
// and redrawn (load_plots.js), then the delta table and the trade-off sentence the server wrote from
// the measured figures, and the Trace of every request of both runs.
import { download } from "../trace/trace.js";
import { all } from "./load_plots.js";
import { loadRun } from "./poller.js";

const POLL_MS = 500;
const q = (sel) => document.querySelector(sel);

// When both runs are over: every request of both on one timeline, a track each (ui/trace/trace.js).
function traceLink(session, s) {
  const holder = q("#lab-load-trace");
  if (!holder) return;
  const requests = (s.runs || []).flatMap((run) => (run.points || []).filter((p) => p.request_id)
    .map((p) => ({ id: p.request_id, label: `${run.label} · ${p.request_id}` })));
  if (!(s.status === "done" || s.status === "stopped") || !requests.length) {
    holder.innerHTML = "";
    return;
  }
  if (holder.dataset.pair === s.id) return;
  holder.dataset.pair = s.id;
  holder.innerHTML = "";
  const a = document.createElement("a");
  a.href = "#";
  a.textContent = `Trace (${requests.length} requests)`;
  a.title = "Download every request of both runs on one timeline, one track each; open it in ui.perfetto.dev.";
  a.addEventListener("click", async (e) => {
    e.preventDefault();
    try {
      await download(session, requests.map((r) => r.id), requests.map((r) => r.label), `latency-lab-load-${s.id}.json`);
    } catch (err) {
      a.textContent = `Trace: ${err.message || err}`;
    }
  });
  holder.appendChild(a);
}

export function closedLoop(session) {
  const cfg = session.cfg;
  return loadRun({
    base: "/lab/load", pollMs: POLL_MS, fields: cfg.loadFields,
    ids: { status: "#lab-load-status", clear: ["#lab-load-sentence", "#lab-load-delta", "#lab-load-reuse"] },
    draw(s, status) {
      const plots = q("#lab-load-plots");
      if (plots) plots.innerHTML = all(s, cfg.glossary, cfg.loadOutcomes);
      const sentence = q("#lab-load-sentence");
      if (sentence) sentence.textContent = s.sentence || "";
      const delta = q("#lab-load-delta");
      if (delta) delta.innerHTML = s.delta_html || "";
      const reuse = q("#lab-load-reuse"); // KV reuse under load: the runs' cache figures and where reuse collapses
      if (reuse) reuse.innerHTML = s.reuse_html ? `<h4>KV reuse</h4>${s.reuse_html}<p class="lab-reuse-sentence"></p>` : "";
      if (reuse && s.reuse_html) reuse.querySelector(".lab-reuse-sentence").textContent = s.reuse_sentence || "";
      const text = { references: s.message, running: s.message, done: "done: both runs finished", stopped: "stopped",
        error: s.message }[s.status];
      status(text || s.status);
      traceLink(session, s);
    },
  });
}
