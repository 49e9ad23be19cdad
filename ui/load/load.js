// Latency Lab Load tab controller: starts a pair of load runs (POST /lab/load/start), polls its
// snapshot while it runs and redraws the plots (load_plots.js), then shows the delta table and
// the trade-off sentence the server wrote from the measured figures.
(function () {
  "use strict";
  const CFG = window.LAB_CONFIG;
  const P = window.LabLoadPlots;
  const POLL_MS = 500;
  const q = (sel) => document.querySelector(sel);
  const load = { id: null, snapshot: null, polls: 0, timer: null };

  function status(text) { const el = q("#lab-load-status"); if (el) el.textContent = text || ""; }

  const { errorText } = window.lab.internal; // the page's one reading of an error body (page.js)

  function draw(s) {
    load.snapshot = s;
    const plots = q("#lab-load-plots");
    if (plots) plots.innerHTML = P.all(s, CFG.glossary);
    const sentence = q("#lab-load-sentence");
    if (sentence) sentence.textContent = s.sentence || "";
    const delta = q("#lab-load-delta");
    if (delta) delta.innerHTML = s.delta_html || "";
    const text = { references: s.message, running: s.message, done: "done: both runs finished", stopped: "stopped",
      error: s.message }[s.status];
    status(text || s.status);
    traceLink(s);
  }

  // When both runs are over: every request of both on one timeline, a track each (ui/trace/trace.js).
  function traceLink(s) {
    const holder = q("#lab-load-trace");
    if (!holder) return;
    const requests = (s.runs || []).flatMap((run) => (run.points || []).filter((p) => p.request_id)
      .map((p) => ({ id: p.request_id, label: `${run.label} · ${p.request_id}` })));
    if (!(s.status === "done" || s.status === "stopped") || !requests.length || !window.LabTrace) {
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
        await window.LabTrace.download(requests.map((r) => r.id), requests.map((r) => r.label), `latency-lab-load-${s.id}.json`);
      } catch (err) {
        a.textContent = `Trace: ${err.message || err}`;
      }
    });
    holder.appendChild(a);
  }

  async function poll() {
    load.timer = null;
    if (!load.id) return;
    const r = await fetch(`/lab/load/${encodeURIComponent(load.id)}`).catch((e) => ({ ok: false, e }));
    if (!r.ok) { status(r.e ? String(r.e) : await errorText(r)); return; }
    const s = await r.json();
    load.polls += 1;
    draw(s);
    if (s.status === "references" || s.status === "running") load.timer = setTimeout(poll, POLL_MS);
  }

  // values: the tab's controls in CFG.loadFields order
  load.start = async (values) => {
    if (load.snapshot && (load.snapshot.status === "running" || load.snapshot.status === "references")) return;
    const settings = {};
    CFG.loadFields.forEach((name, i) => { settings[name] = values[i]; });
    status("starting…");
    const r = await fetch("/lab/load/start", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ settings }) });
    if (!r.ok) { status(await errorText(r)); return; }
    load.id = (await r.json()).id;
    load.snapshot = { status: "references" };
    ["#lab-load-sentence", "#lab-load-delta"].forEach((sel) => { const el = q(sel); if (el) el.innerHTML = ""; });
    poll();
  };

  load.stop = async () => {
    if (!load.id) return;
    await fetch(`/lab/load/${encodeURIComponent(load.id)}/stop`, { method: "POST" });
  };

  window.lab = window.lab || {};
  window.lab.load = load;
})();
