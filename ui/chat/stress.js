// This browser's paint limit: the stress run. The paced test source streams one long markdown reply
// (ui/chat/stress.py: ~4,000 tokens of headings, lists, code blocks and tables) at rising rates through
// the Chat tab's own path (the SSE stream, the markdown renderer, the live overlays); for each rate the
// page measures paint lag p50/p99 (each painted chunk against the server's emit of its last token, on
// the browser's axis), long tasks (PerformanceObserver), render cost per text update split into
// markdown (parsing into detached nodes) and DOM (the rest of the update), the overlays' redraws, the
// long animation frames' style and layout, and dropped frames; then it names the first rate at which it
// falls behind and where its time went. The summaries are pure (Node-tested).
import { esc, fmtInt, fmtMs } from "../shell/format.js";
import { clear } from "./actions.js";
import { viewOf } from "./overlays.js";
import { run } from "./run.js";
import { addUser } from "./transcript.js";

const FRAME_MS = 1000 / 60;

// The q-th percentile (0–100) of the known values, linearly interpolated; null when none. Pure.
export function pct(xs, q) {
  const s = xs.filter((v) => v != null && isFinite(v)).sort((a, b) => a - b);
  if (!s.length) return null;
  const k = ((s.length - 1) * q) / 100, lo = Math.floor(k), hi = Math.ceil(k);
  return s[lo] + (s[hi] - s[lo]) * (k - lo);
}

// Paint lag of each painted chunk: when it was painted minus when the server sampled its last token,
// both on the browser's axis (null without a clock offset). Pure: `v` is overlays.js viewOf.
export function paintLags(v) {
  if (!v.clockKnown) return null;
  return v.paint.filter(([, n]) => n > 0 && v.serverTokens[n - 1]).map(([t, n]) => t - v.serverTokens[n - 1][0]);
}

// Frames the page missed between successive animation frames (a gap of k frame times missed k − 1). Pure.
export function droppedFrames(times, frameMs) {
  let dropped = 0;
  for (let i = 1; i < times.length; i++) dropped += Math.max(0, Math.round((times[i] - times[i - 1]) / (frameMs || FRAME_MS)) - 1);
  return dropped;
}

// How render cost per update grows with the reply: the mean cost of the last quarter of the updates
// over that of the first quarter (~1: flat; an O(reply) re-render per update: ~ the length ratio). Pure.
export function costGrowth(costs) {
  const per = costs.map(([, md, dom]) => md + dom);
  const q = Math.floor(per.length / 4);
  if (q < 5) return null;
  const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length; // means: performance.now() ticks are ~0.1 ms
  const early = mean(per.slice(0, q)), late = mean(per.slice(-q));
  return early > 0 ? late / early : null;
}

// One rate's figures from what the page recorded. Pure.
export function summarize(rate, rec, target) {
  const lags = rec.lags || [];
  const fifth = Math.max(1, Math.floor(lags.length / 5));
  const growth = lags.length >= 10 ? pct(lags.slice(-fifth), 50) - pct(lags.slice(0, fifth), 50) : null;
  const sum = (i) => rec.costs.reduce((a, c) => a + c[i], 0);
  const row = {
    rate, tokens: rec.tokens, chunks: rec.costs.length,
    lag_p50_ms: rec.lags ? pct(lags, 50) : null, lag_p99_ms: rec.lags ? pct(lags, 99) : null, lag_growth_ms: growth,
    long_tasks: rec.longTasks.length, long_task_ms: rec.longTasks.reduce((a, b) => a + b, 0),
    markdown_ms: sum(1), dom_ms: sum(2),
    markdown_ms_per_chunk: rec.costs.length ? sum(1) / rec.costs.length : null,
    dom_ms_per_chunk: rec.costs.length ? sum(2) / rec.costs.length : null,
    cost_growth: costGrowth(rec.costs),
    overlay_ms: rec.overlayMs, layout_ms: rec.layoutMs,
    frames: rec.frames.length, dropped_frames: droppedFrames(rec.frames),
  };
  row.behind = row.lag_p99_ms == null ? null : row.lag_p99_ms > target || (growth != null && growth > target);
  return row;
}

// Where the main thread's measured time went at one rate: the largest part first. Pure.
export function timeGoes(row) {
  const parts = [["markdown parsing", row.markdown_ms], ["DOM updates", row.dom_ms], ["overlay redraws", row.overlay_ms],
    ["style and layout (long frames)", row.layout_ms]].filter(([, ms]) => ms != null && ms > 0);
  parts.sort((a, b) => b[1] - a[1]);
  return parts.map(([k, ms]) => `${k} ${fmtMs(ms)}`).join(", ");
}

// The one sentence: up to which rate this browser keeps up, where it falls behind and why. Pure.
export function verdict(rows, target) {
  const known = rows.filter((r) => r.behind != null);
  if (!known.length) return "No paint lag could be measured (no clock offset yet): run it again in a moment.";
  const behind = known.find((r) => r.behind);
  const ok = known.filter((r) => !r.behind && (!behind || r.rate < behind.rate));
  const kept = ok.length ? `This browser keeps up to ${fmtInt(ok[ok.length - 1].rate)} tok/s (paint lag p99 ≤ ${fmtMs(target)})` : "This browser keeps up at none of these rates";
  if (!behind) return `${kept}; it did not fall behind at any rate tried. Its time went to: ${timeGoes(known[known.length - 1])}.`;
  return `${kept}; at ${fmtInt(behind.rate)} tok/s it falls behind (paint lag p99 ${fmtMs(behind.lag_p99_ms)}` +
    (behind.lag_growth_ms > 0 ? `, growing ${fmtMs(behind.lag_growth_ms)} over the reply` : "") +
    `). There its time went to: ${timeGoes(behind)}; ${fmtInt(behind.long_tasks)} long tasks, ${fmtInt(behind.dropped_frames)} dropped frames.`;
}

const COLUMNS = [["rate", "tok/s", fmtInt], ["tokens", "tokens", fmtInt], ["lag_p50_ms", "paint lag p50", fmtMs],
  ["lag_p99_ms", "paint lag p99", fmtMs], ["long_tasks", "long tasks", fmtInt], ["long_task_ms", "in long tasks", fmtMs],
  ["markdown_ms_per_chunk", "markdown / update", fmtMs], ["dom_ms_per_chunk", "DOM / update", fmtMs],
  ["cost_growth", "late / early cost", (v) => (v == null ? "—" : v.toFixed(2) + "×")],
  ["dropped_frames", "dropped frames", fmtInt]];

export function tableHtml(rows, target, G) {
  const head = COLUMNS.map(([k, label]) => `<th title="${esc((G && G["stress_" + k] && G["stress_" + k].hover) || label)}">${esc(label)}</th>`).join("");
  const body = rows.map((r) => `<tr class="${r.behind ? "lab-behind" : ""}" data-rate="${r.rate}">` +
    COLUMNS.map(([k, , f]) => `<td>${esc(f(r[k]))}</td>`).join("") + "</tr>").join("");
  return `<table class="lab-stress-table"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table>` +
    `<p class="lab-stress-verdict">${esc(verdict(rows, target))}</p>`;
}

// ---- the run, in the page -----------------------------------------------------------------------
function observe(type, fn) {
  if (!(PerformanceObserver.supportedEntryTypes || []).includes(type)) return null;
  const o = new PerformanceObserver((list) => list.getEntries().forEach(fn));
  o.observe({ type, buffered: false });
  return o;
}

async function oneRate(session, rate) {
  await clear(session, "chat"); // every rate starts from the same page
  addUser("chat", `stress run: ${rate} tok/s`);
  const rec = { longTasks: [], frames: [], layoutMs: 0 };
  const o1 = observe("longtask", (e) => rec.longTasks.push(e.duration));
  const o2 = observe("long-animation-frame", (e) => { // style and layout of the long frames
    if (e.styleAndLayoutStart) rec.layoutMs += e.startTime + e.duration - e.styleAndLayoutStart;
  });
  let going = true;
  const frame = (t) => { rec.frames.push(t); if (going) requestAnimationFrame(frame); };
  requestAnimationFrame(frame);
  const overlay0 = session.overlayCost.total;
  const r = await run(session, "chat", { message: `stress run: ${rate} tok/s`, settings: { smoothing: "off" }, stress_tps: rate },
    performance.now(), "sse", `stress run · ${rate} tok/s`);
  going = false;
  await new Promise((res) => setTimeout(res, 50)); // the observers' last entries
  o1?.disconnect(); o2?.disconnect();
  if (r.error) throw new Error(r.error);
  rec.overlayMs = session.overlayCost.total - overlay0;
  rec.costs = r.costs;
  rec.tokens = r.row ? r.row.output_tokens : null;
  rec.lags = paintLags(viewOf(r.timeline, r.client || r.rec.toClient(r.transport), {}));
  return rec;
}

export async function stressRun(session, rates) {
  const cfg = session.cfg.stress, box = document.querySelector("#lab-stress .lab-stress-out");
  const list = rates && rates.length ? rates : cfg.rates;
  if (session.busy()) return null;
  await session.ready;
  const rows = [];
  session.stress = { running: true, rows, error: null };
  try {
    for (const rate of list) {
      if (box) box.innerHTML = `<p class="lab-muted">stress run: ${esc(fmtInt(rate))} tok/s…</p>` + (rows.length ? tableHtml(rows, cfg.target_p99_ms, session.cfg.glossary) : "");
      rows.push(summarize(rate, await oneRate(session, rate), cfg.target_p99_ms));
    }
    if (box) box.innerHTML = tableHtml(rows, cfg.target_p99_ms, session.cfg.glossary);
  } catch (err) {
    session.stress.error = String(err.message || err);
    if (box) box.innerHTML = `<p class="lab-error">${esc(session.stress.error)}</p>`;
  }
  session.stress.running = false;
  session.stress.verdict = rows.length ? verdict(rows, cfg.target_p99_ms) : null;
  return session.stress;
}
