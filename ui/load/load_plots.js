// Latency Lab Load tab plots: pure SVG strings from a load pair's snapshot (ui/load/run.py
// LoadPair.to_dict), no DOM. Throughput over time (a line per run on one time axis) and the
// latency distributions (a dot per request, a row per run, the p50 marked), glossary names.
import { esc, fmtMs, niceMax, num, p50, ticks } from "../shell/format.js";

const W = 560, LEFT = 96, RIGHT = 14;
const COLORS = ["#64748b", "#6366f1"]; // run 1, run 2
const BAD = "#dc2626";
const fmt = (v, unit) => (v == null ? "—" : (v >= 100 ? Math.round(v).toLocaleString("en-US") : (+v).toPrecision(3)) + (unit ? " " + unit : ""));

function xAxis(xMax, y, top, fmtTick) {
  const x = (t) => LEFT + (Math.max(0, t) / xMax) * (W - LEFT - RIGHT);
  let s = "";
  const ts = ticks(xMax, 5);
  ts.forEach((t, i) => {
    const anchor = i === ts.length - 1 ? "end" : i === 0 ? "start" : "middle";
    s += `<line x1="${x(t)}" x2="${x(t)}" y1="${top}" y2="${y}" class="lab-grid"/>`;
    s += `<text x="${x(t)}" y="${y + 12}" class="lab-tick" text-anchor="${anchor}">${esc(fmtTick(t))}</text>`;
  });
  return { s, x };
}

// One unit per axis (not "5,000 ms" beside "10.0 s").
function msTick(xMax) {
  return xMax >= 10000 ? (t) => `${+(t / 1000).toFixed(1)} s` : (t) => `${+t.toFixed(1)} ms`;
}

function svg(height, body, cls, label) {
  return `<svg class="lab-svg ${cls}" viewBox="0 0 ${W} ${height}" role="img" aria-label="${esc(label)}">${body}</svg>`;
}

// One throughput over time: a line per run (each run's own t=0), on one axis, its latest value dotted.
export function series(runs, key, title, unit) {
  const H = 110, top = 8, bottom = H - 18;
  const tMax = niceMax(Math.max(1, ...runs.map((r) => r.elapsed_s || 0)));
  const vMax = niceMax(Math.max(0, ...runs.flatMap((r) => r.throughput.map((p) => p[key]))));
  const ax = xAxis(tMax, bottom, top, (t) => `${+t.toFixed(1)} s`);
  const y = (v) => bottom - (v / vMax) * (bottom - top);
  let body = ax.s + `<text x="4" y="${top + 10}" class="lab-muted">${esc(title)}</text>` +
    `<text x="4" y="${top + 24}" class="lab-tick">max ${esc(fmt(vMax, unit))}</text>`;
  runs.forEach((r, i) => {
    if (!r.throughput.length) return;
    const d = r.throughput.map((p, j) => `${j ? "L" : "M"}${ax.x(p.t_s).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
    const end = r.throughput[r.throughput.length - 1];
    body += `<circle cx="${ax.x(end.t_s).toFixed(1)}" cy="${y(end[key]).toFixed(1)}" r="3" fill="${COLORS[i]}"><title>${esc(r.label)}: ${esc(fmt(end[key], unit))} at ${end.t_s.toFixed(1)} s</title></circle>`;
    body += `<path class="lab-load-line" data-run="${i}" data-points="${r.throughput.length}" d="${d}" fill="none" stroke="${COLORS[i]}" stroke-width="2"><title>${esc(r.label)}: ${esc(title)}</title></path>`;
  });
  return svg(H, body, `lab-load-throughput lab-load-${key}`, title);
}

// One latency metric: a row per run, a dot per request (red: not a complete reply as judged), p50 marked.
export function distribution(runs, key, G, judged) {
  const rowH = 26, top = 6, H = top + runs.length * rowH + 20, bottom = H - 18;
  const all = runs.flatMap((r) => r.points.map((p) => num(p[key]))).filter((v) => v != null);
  const xMax = niceMax(Math.max(1, ...all));
  const ax = xAxis(xMax, bottom, top, msTick(xMax));
  let body = ax.s;
  runs.forEach((r, i) => {
    const cy = top + i * rowH + rowH / 2;
    body += `<text x="4" y="${cy + 4}" class="lab-tick">${esc(r.label)}</text>`;
    r.points.forEach((p, j) => {
      const v = num(p[key]);
      if (v == null) return;
      const jitter = ((j * 7919) % 13) / 13 - 0.5; // deterministic spread so equal values stay visible
      const bad = !judged.complete.includes(p.outcome);
      body += `<circle class="lab-load-dot" data-run="${i}" cx="${ax.x(v).toFixed(1)}" cy="${(cy + jitter * (rowH - 10)).toFixed(1)}" r="3" fill="${bad ? BAD : COLORS[i]}" fill-opacity="0.65"><title>${esc(key)} ${esc(fmtMs(v))} (${esc(p.outcome)})</title></circle>`;
    });
    const m = p50(r.points.filter((p) => judged.complete.includes(p.outcome)).map((p) => num(p[key])));
    if (m != null) body += `<line class="lab-load-p50" x1="${ax.x(m)}" x2="${ax.x(m)}" y1="${cy - rowH / 2 + 2}" y2="${cy + rowH / 2 - 2}" stroke-width="2"><title>p50 ${esc(fmtMs(m))}</title></line>`;
  });
  const hover = (G[key] && G[key].hover) || key;
  return `<div class="lab-load-dist"><h5 title="${esc(hover)}">${esc(key)}</h5>${svg(H, body, `lab-load-${key}`, key)}</div>`;
}

const DIFFERS_HOVER = "replies unlike the same request alone, where the server does not promise exact replies " +
  "(bf16 or quantized weights, a remote server): a batch or a cached prefix may round a near-tie the other way";

// The judge's counts of one run so far, from its points (its figures say the same at the end).
// judged: the judge's verdicts (server/load/figures.py, the config's loadOutcomes): {complete: whole
// replies (exact, or differing where the server does not promise exact replies), bad: failures}.
export function counts(r, judged) {
  const c = { requests: r.points.length, errors: 0 };
  [...judged.complete, ...judged.bad].forEach((k) => { c[k] = 0; });
  r.points.forEach((p) => { if (p.outcome in c) c[p.outcome] += 1; else if (p.outcome !== "cancelled") c.errors += 1; });
  return c;
}

function legend(runs, judged) {
  return `<div class="lab-load-legend">` + runs.map((r, i) => {
    const c = counts(r, judged);
    const bad = judged.bad.map((k) => `<span data-count="${k}">${k} ${c[k]}</span>`).join(" · ");
    const differs = c.differs ? ` · <span data-count="differs" title="${esc(DIFFERS_HOVER)}">differs ${c.differs}</span>` : "";
    return `<div class="lab-load-run" data-run="${i}"><span class="lab-swatch" style="background:${COLORS[i]}"></span>` +
      `<b>run ${i + 1}: ${esc(r.label)}</b> <span class="lab-muted">(${esc(r.status)}, ${(r.elapsed_s || 0).toFixed(1)} s)</span> · ` +
      `${c.requests} done · <span data-count="exact">exact ${c.exact}</span>${differs} · ${bad} · <span data-count="errors">errors ${c.errors}</span></div>`;
  }).join("") + `</div>`;
}

export function all(snapshot, G, judged) {
  const runs = snapshot.runs;
  if (runs.every((r) => r.status === "waiting")) {
    return legend(runs, judged) + `<div class="lab-muted">The plots start with run 1, once every request's reference is computed.</div>`;
  }
  return legend(runs, judged) +
    `<div class="lab-load-grid"><div class="lab-card"><h4>Throughput over time</h4>` +
    series(runs, "output_tok_per_s", "output tok/s", "tok/s") + series(runs, "req_per_s", "requests/s", "req/s") +
    `<div class="lab-muted">completed replies so far ÷ time so far: the last point is the run's figure</div></div>` +
    `<div class="lab-card"><h4>Latency distributions</h4>` +
    ["ttft_ms", "tpot_ms", "queue_ms"].map((k) => distribution(runs, k, G || {}, judged)).join("") +
    `<div class="lab-muted">a dot per request (red: not a whole reply, or not the one it should be); the bar is the p50</div></div></div>`;
}
