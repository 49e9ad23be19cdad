// Latency Lab Load tab, open loop: starts a sweep (POST /lab/load/open/start), polls its snapshot
// while it runs and redraws the plots (open_plots.js), then shows the table of levels and the
// Pareto sentence the server wrote from the measured figures.
(function () {
  "use strict";
  const CFG = window.LAB_CONFIG;
  const P = window.LabOpenPlots;
  const POLL_MS = 700;
  const q = (sel) => document.querySelector(sel);
  const ol = { id: null, snapshot: null, polls: 0, timer: null };

  function status(text) { const el = q("#lab-openloop-status"); if (el) el.textContent = text || ""; }

  const { errorText } = window.lab.internal; // the page's one reading of an error body (page.js)

  function draw(s) {
    ol.snapshot = s;
    const plots = q("#lab-openloop-plots");
    if (plots) plots.innerHTML = P.all(s, CFG.glossary);
    const table = q("#lab-openloop-table");
    if (table) table.innerHTML = P.table(s, CFG.glossary);
    const sentence = q("#lab-openloop-sentence");
    if (sentence) sentence.textContent = s.sentence || "";
    const text = { references: s.message, running: s.message, done: `done in ${s.elapsed_s} s`, stopped: "stopped",
      error: s.message }[s.status];
    status(text || s.status);
  }

  async function poll() {
    ol.timer = null;
    if (!ol.id) return;
    const r = await fetch(`/lab/load/open/${encodeURIComponent(ol.id)}`).catch((e) => ({ ok: false, e }));
    if (!r.ok) { status(r.e ? String(r.e) : await errorText(r)); return; }
    const s = await r.json();
    ol.polls += 1;
    draw(s);
    if (s.status === "references" || s.status === "running") ol.timer = setTimeout(poll, POLL_MS);
  }

  // values: the open-loop controls in CFG.openLoopFields order
  ol.start = async (values) => {
    if (ol.snapshot && (ol.snapshot.status === "running" || ol.snapshot.status === "references")) return;
    const settings = {};
    CFG.openLoopFields.forEach((name, i) => { settings[name] = values[i]; });
    status("starting…");
    const r = await fetch("/lab/load/open/start", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ settings }) });
    if (!r.ok) { status(await errorText(r)); return; }
    ol.id = (await r.json()).id;
    ol.snapshot = { status: "references" };
    ["#lab-openloop-sentence", "#lab-openloop-table", "#lab-openloop-plots"].forEach((sel) => { const el = q(sel); if (el) el.innerHTML = ""; });
    poll();
  };

  ol.stop = async () => {
    if (!ol.id) return;
    await fetch(`/lab/load/open/${encodeURIComponent(ol.id)}/stop`, { method: "POST" });
  };

  window.lab = window.lab || {};
  window.lab.openLoop = ol;
})();
