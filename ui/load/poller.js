// A load run of either kind, from the browser: started with the tab's values (POST {base}/start), then
// its snapshot polled while it runs and drawn each time, until it is done, stopped or failed; Stop
// asks the server to end it. The closed loop (ui/load/load.js) and the open loop (open_loop.js) each
// make one with their own fields, containers and drawing.
import { errorText, postJSON } from "../shell/http.js";

// base: "/lab/load" or "/lab/load/open"; fields: the controls' names in order; ids: {status, clear: [...]}
// (the containers emptied when a run starts); draw(snapshot, status): redraws the tab.
export function loadRun({ base, pollMs, fields, ids, draw }) {
  const q = (sel) => document.querySelector(sel);
  const status = (text) => { const el = q(ids.status); if (el) el.textContent = text || ""; };
  const ctl = { id: null, snapshot: null, polls: 0, timer: null };

  async function poll() {
    ctl.timer = null;
    if (!ctl.id) return;
    const r = await fetch(`${base}/${encodeURIComponent(ctl.id)}`).catch((e) => ({ ok: false, e }));
    if (!r.ok) { status(r.e ? String(r.e) : await errorText(r)); return; }
    const s = await r.json();
    ctl.polls += 1;
    ctl.snapshot = s;
    draw(s, status);
    if (s.status === "references" || s.status === "running") ctl.timer = setTimeout(poll, pollMs);
  }

  // values: the tab's controls, in the order of `fields`
  ctl.start = async (values) => {
    if (ctl.snapshot && (ctl.snapshot.status === "running" || ctl.snapshot.status === "references")) return;
    const settings = {};
    fields.forEach((name, i) => { settings[name] = values[i]; });
    status("starting…");
    const r = await postJSON(`${base}/start`, { settings });
    if (!r.ok) { status(await errorText(r)); return; }
    ctl.id = (await r.json()).id;
    ctl.snapshot = { status: "references" };
    ids.clear.forEach((sel) => { const el = q(sel); if (el) el.innerHTML = ""; });
    poll();
  };

  ctl.stop = async () => {
    if (!ctl.id) return;
    await fetch(`${base}/${encodeURIComponent(ctl.id)}/stop`, { method: "POST" });
  };

  return ctl;
}
