// Latency Lab Load tab, open loop: a sweep (POST /lab/load/open/start), polled while it runs and
// redrawn (open_plots.js), then the table of levels and the Pareto sentence the server wrote from the
// measured figures.
import { all, table } from "./open_plots.js";
import { loadRun } from "./poller.js";

const POLL_MS = 700;
const q = (sel) => document.querySelector(sel);

export function openLoop(cfg) {
  return loadRun({
    base: "/lab/load/open", pollMs: POLL_MS, fields: cfg.openLoopFields,
    ids: { status: "#lab-openloop-status", clear: ["#lab-openloop-sentence", "#lab-openloop-table", "#lab-openloop-plots"] },
    draw(s, status) {
      const plots = q("#lab-openloop-plots");
      if (plots) plots.innerHTML = all(s, cfg.glossary);
      const levels = q("#lab-openloop-table");
      if (levels) levels.innerHTML = table(s, cfg.glossary);
      const sentence = q("#lab-openloop-sentence");
      if (sentence) sentence.textContent = s.sentence || "";
      const text = { references: s.message, running: s.message, done: `done in ${s.elapsed_s} s`, stopped: "stopped",
        error: s.message }[s.status];
      status(text || s.status);
    },
  });
}
