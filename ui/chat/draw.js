// A pane's overlays, redrawn live while its reply streams (the builders are ui/chat/overlays.js). A/B
// panes share one time scale. Live redraws take at most ~10% of the main thread: a redraw that cost c
// ms waits 10·c ms; the cost is measured and shown under the overlays.
import { all, extent, fmtMs, viewOf } from "./overlays.js";
import { overlayEl } from "./transcript.js";

const DRAW_EVERY_MS = 100; // live overlay redraws at most ~10 per second
const COST_HOVER = "Time to build and insert the overlays' SVG on this page (the browser's main thread), averaged over every redraw so far";

function viewOfRun(session, r) {
  const client = r.client || r.rec.toClient(r.transport);
  return viewOf(r.timeline, client, {
    now: r.finished ? null : performance.now() - r.sendAt,
    readingPace: session.pane(r.pane).pace,
    variant: r.record?.settings?.quantization || null,
  });
}

export function drawPane(session, p) {
  const group = p === "A" || p === "B" ? ["A", "B"] : [p];
  const views = group.map((name) => { const s = session.pane(name).selected; return s ? viewOfRun(session, s) : null; });
  const xMax = extent(views.filter(Boolean)); // A and B share one time scale
  group.forEach((name, i) => {
    const el = overlayEl(name);
    if (!el || !views[i]) return;
    const t0 = performance.now();
    el.innerHTML = all(views[i], { glossary: session.cfg.glossary, xMax });
    const cost = performance.now() - t0;
    const c = session.overlayCost;
    c.n += 1; c.total += cost; c.max = Math.max(c.max, cost);
    const P = session.pane(name);
    P.lastCost = cost;
    const foot = document.createElement("div");
    foot.className = "lab-cost";
    foot.title = COST_HOVER;
    foot.textContent = `overlay redraw ${fmtMs(c.total / c.n)} avg · ${fmtMs(c.max)} max · ${c.n} redraws`;
    el.appendChild(foot);
    P.lastDraw = performance.now();
  });
}

export function scheduleDraw(session, p) {
  const P = session.pane(p);
  if (P.draw) return;
  const every = Math.max(DRAW_EVERY_MS, 10 * (P.lastCost || 0));
  const wait = Math.max(0, every - (performance.now() - P.lastDraw));
  P.draw = setTimeout(() => requestAnimationFrame(() => { P.draw = null; drawPane(session, p); }), wait);
}

// Keeps the live bars growing while waiting for tokens, as long as some pane's reply runs.
let ticking = null;
export function ticker(session) {
  if (ticking) return;
  ticking = setInterval(() => {
    const live = Object.values(session.panes).filter((P) => P.run && !P.run.finished);
    if (!live.length) { clearInterval(ticking); ticking = null; return; }
    live.forEach((P) => scheduleDraw(session, P.name));
  }, DRAW_EVERY_MS);
}
