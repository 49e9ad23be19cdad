// Latency Lab Load tab, open loop: pure SVG strings from a sweep's snapshot (ui/load/open_run.py
// OpenRun.to_dict), no DOM. Per max batch a curve: latency and throughput/goodput against the
// offered rate (objectives dashed, the knee ringed), the Pareto plot (total output tok/s against
// tok/s per user) and the probe's stage bars per level. Field names: vLLM's (server/load/serve_figures.py).
import { esc, fmtMs, niceMax, num, ticks } from "../shell/format.js";

const W = 520, LEFT = 52, RIGHT = 14, TOP = 22, H = 190, BOTTOM = H - 26;
const COLORS = ["#64748b", "#6366f1", "#0ea5e9", "#f59e0b", "#10b981", "#ec4899"];
const STAGES = [["queue_ms", "queue", "#cbd5e1"], ["setup_ms", "setup", "#a5b4fc"], ["prefill_ms", "prefill", "#6366f1"],
  ["decode_ms", "decode", "#0ea5e9"]];
const fmt = (v) => (v == null ? "—" : Number.isInteger(v) ? v.toLocaleString("en-US") : Math.abs(v) >= 100 ? Math.round(v).toLocaleString("en-US") : (+v).toPrecision(3));

function frame(xMax, yMax, xLabel, yLabel, xFmt, yFmt) {
  const x = (v) => LEFT + (v / xMax) * (W - LEFT - RIGHT);
  const y = (v) => BOTTOM - (v / yMax) * (BOTTOM - TOP);
  let s = "";
  ticks(xMax, 5).forEach((t) => {
    s += `<line x1="${x(t)}" x2="${x(t)}" y1="${TOP}" y2="${BOTTOM}" class="lab-grid"/>` +
      `<text x="${x(t)}" y="${BOTTOM + 12}" class="lab-tick" text-anchor="middle">${esc(xFmt(t))}</text>`;
  });
  ticks(yMax, 4).forEach((t) => {
    s += `<line x1="${LEFT}" x2="${W - RIGHT}" y1="${y(t)}" y2="${y(t)}" class="lab-grid"/>` +
      `<text x="${LEFT - 4}" y="${y(t) + 3}" class="lab-tick" text-anchor="end">${esc(yFmt(t))}</text>`;
  });
  s += `<text x="${W - RIGHT}" y="${H - 2}" class="lab-tick" text-anchor="end">${esc(xLabel)}</text>` +
    `<text x="4" y="12" class="lab-muted">${esc(yLabel)}</text>`;
  return { s, x, y };
}

function svg(body, cls, label) {
  return `<svg class="lab-svg ${cls}" viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(label)}">${body}</svg>`;
}

// One figure against the offered rate: a line per sweep; `objective` dashed; `knee` rings the knee level.
export function vsRate(sweeps, key, title, objective, knee) {
  const rows = sweeps.flatMap((s) => s.levels);
  const xMax = niceMax(Math.max(0.1, ...rows.map((r) => r.request_rate)));
  const yMax = niceMax(Math.max(objective || 0, 1e-3, ...rows.map((r) => num(r[key]) || 0)) * 1.05);
  const f = frame(xMax, yMax, "offered rate (req/s)", title, (t) => `${+t.toFixed(2)}`, (t) => fmt(t));
  let body = f.s;
  if (objective) body += `<line class="lab-ol-objective" x1="${LEFT}" x2="${W - RIGHT}" y1="${f.y(objective)}" y2="${f.y(objective)}" stroke="#dc2626" stroke-dasharray="4 3"><title>objective ${esc(fmt(objective))}</title></line>`;
  sweeps.forEach((s, i) => {
    const pts = s.levels.map((r) => [r.request_rate, num(r[key])]).filter((p) => p[1] != null);
    if (!pts.length) return;
    const d = pts.map((p, j) => `${j ? "L" : "M"}${f.x(p[0]).toFixed(1)},${f.y(p[1]).toFixed(1)}`).join("");
    body += `<path class="lab-ol-line" data-key="${esc(key)}" data-sweep="${i}" data-points="${pts.length}" d="${d}" fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2"/>`;
    pts.forEach((p) => { body += `<circle cx="${f.x(p[0]).toFixed(1)}" cy="${f.y(p[1]).toFixed(1)}" r="3" fill="${COLORS[i % COLORS.length]}"><title>${esc(s.label)}: ${esc(fmt(p[1]))} at ${esc(fmt(p[0]))} req/s</title></circle>`; });
    const k = s.knee_index;
    if (knee && k != null && s.levels[k] && num(s.levels[k][key]) != null) {
      body += `<circle class="lab-ol-knee" data-sweep="${i}" cx="${f.x(s.levels[k].request_rate).toFixed(1)}" cy="${f.y(s.levels[k][key]).toFixed(1)}" r="7" fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2"><title>knee of ${esc(s.label)}: ${esc(fmt(s.levels[k].request_rate))} req/s offered</title></circle>`;
    }
  });
  return svg(body, `lab-ol-vs-rate lab-ol-${key}`, title);
}

// The Pareto plot: a point per level, a line per sweep, total output tok/s (x) against tok/s per user (y).
export function pareto(sweeps) {
  const pts = sweeps.flatMap((s) => s.pareto);
  const xMax = niceMax(Math.max(1, ...pts.map((p) => p.output_throughput)) * 1.05);
  const yMax = niceMax(Math.max(1, ...pts.map((p) => p.output_throughput_per_user)) * 1.05);
  const f = frame(xMax, yMax, "total output tok/s", "tok/s per user", (t) => fmt(t), (t) => fmt(t));
  let body = f.s;
  sweeps.forEach((s, i) => {
    if (!s.pareto.length) return;
    const sorted = [...s.pareto].sort((a, b) => a.request_rate - b.request_rate);
    const d = sorted.map((p, j) => `${j ? "L" : "M"}${f.x(p.output_throughput).toFixed(1)},${f.y(p.output_throughput_per_user).toFixed(1)}`).join("");
    body += `<path class="lab-ol-pareto-line" data-sweep="${i}" data-points="${sorted.length}" d="${d}" fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="2"/>`;
    sorted.forEach((p) => { body += `<circle cx="${f.x(p.output_throughput).toFixed(1)}" cy="${f.y(p.output_throughput_per_user).toFixed(1)}" r="3.5" fill="${COLORS[i % COLORS.length]}"><title>${esc(s.label)} at ${esc(fmt(p.request_rate))} req/s: ${esc(fmt(p.output_throughput))} tok/s total, ${esc(fmt(p.output_throughput_per_user))} per user</title></circle>`; });
  });
  return svg(body, "lab-ol-pareto", "Pareto: tokens per second per user against total");
}

// The probe's stages at each level: a stacked bar per level and sweep, the batch sizes it shared beside it.
export function probeBars(sweeps, G) {
  const rows = [];
  sweeps.forEach((s, i) => s.levels.forEach((r, j) => { if (s.probes[j]) rows.push({ s, i, j, r, p: s.probes[j] }); }));
  if (!rows.length) return `<div class="lab-muted">The probe's bars appear after the first level.</div>`;
  const stages = (p) => (p.prefill_ms != null ? STAGES.map(([k, label, c]) => [k, label, c, num(p[k]) || 0])
    : [["ttft_ms", "TTFT (client)", "#6366f1", num(p.ttft_ms) || 0], ["rest", "rest", "#0ea5e9", Math.max(0, (num(p.e2el_ms) || 0) - (num(p.ttft_ms) || 0))]]);
  const total = (p) => stages(p).reduce((a, st) => a + st[3], 0);
  const tMax = niceMax(Math.max(1, ...rows.map((x) => total(x.p))));
  const rowH = 20, LBL = 150, RT = 150, h = rows.length * rowH + 30, w = 640;
  const x = (v) => LBL + (v / tMax) * (w - LBL - RT);
  let body = "";
  rows.forEach((row, n) => {
    const y = 6 + n * rowH;
    let at = 0;
    body += `<text x="4" y="${y + 12}" class="lab-rowlabel">${esc(row.s.label)} · ${esc(fmt(row.r.request_rate))} req/s</text>`;
    body += `<g class="lab-ol-probe-bar" data-sweep="${row.i}" data-level="${row.j}" data-outcome="${esc(row.p.outcome)}">`;
    stages(row.p).forEach(([k, label, color, v]) => {
      if (v <= 0) return;
      const hover = (G[k] && G[k].hover) || label;
      body += `<rect data-stage="${esc(label)}" x="${x(at).toFixed(1)}" y="${y}" width="${Math.max(0.5, x(at + v) - x(at)).toFixed(1)}" height="${rowH - 6}" fill="${color}"><title>${esc(label)} ${esc(fmtMs(v))} — ${esc(hover)}</title></rect>`;
      at += v;
    });
    const batch = row.p.batch_size_mean != null ? `batch ${fmt(row.p.batch_size_mean)} (max ${row.p.batch_size_max})` : "batch —";
    body += `</g><text x="${x(at) + 4}" y="${y + 12}" class="lab-barlabel">${esc(fmtMs(at))} · ${esc(batch)}${row.p.outcome === "exact" || row.p.outcome === "differs" ? "" : " · " + esc(row.p.outcome)}</text>`;
  });
  const legend = (rows.some((r) => r.p.prefill_ms != null) ? STAGES : [["", "TTFT (client)", "#6366f1"], ["", "rest", "#0ea5e9"]])
    .map(([, label, c]) => `<span class="lab-swatch" style="background:${c}"></span> ${esc(label)}`).join(" ");
  return `<svg class="lab-svg lab-ol-probe" viewBox="0 0 ${w} ${h}" role="img" aria-label="the probe's stages per level">${body}</svg>` +
    `<div class="lab-muted">${legend} · the batch sizes are those of the forwards that made its tokens</div>`;
}

export function legend(snapshot, G) {
  return `<div class="lab-load-legend">` + snapshot.sweeps.map((s, i) => {
    const bad = ["lost", "crossed", "mismatched", "stuck"].map((k) => `<span data-count="${k}">${k} ${s.totals[k]}</span>`).join(" · ");
    const knee = s.knee_request_rate == null ? "knee —" : `knee ${s.knee_reached === false ? "≥ " : ""}${fmt(s.knee_request_rate)} req/s${s.knee_reached === false ? " (no level saturated)" : ""}`;
    const live = s.running_rate != null ? ` · level at ${fmt(s.running_rate)} req/s: ${s.points.length} replies so far` : "";
    return `<div class="lab-ol-sweep" data-sweep="${i}"><span class="lab-swatch" style="background:${COLORS[i % COLORS.length]}"></span>` +
      `<b>${esc(s.label)}</b>: ${s.levels.length} levels · <span data-knee title="${esc(((G || {}).knee || {}).hover || "")}">${esc(knee)}</span> · best goodput ${esc(fmt(s.max_request_goodput))} req/s · ${bad}${esc(live)}</div>`;
  }).join("") + `</div>`;
}

export function all(snapshot, G) {
  if (!snapshot.sweeps || !snapshot.sweeps.length) return "";
  const sw = snapshot.sweeps, ob = snapshot.spec.objectives || {};
  const card = (title, inner) => `<div class="lab-card"><h4>${esc(title)}</h4>${inner}</div>`;
  return legend(snapshot, G) + `<div class="lab-load-grid">` +
    card("Throughput and goodput", vsRate(sw, "request_goodput", "goodput (req/s)", null, true) +
      vsRate(sw, "output_throughput", "output tok/s", null, false)) +
    card("Latency (client clock)", vsRate(sw, "p90_ttft_ms", "p90 TTFT (ms)", ob.ttft, false) +
      vsRate(sw, "p90_tpot_ms", "p90 TPOT (ms)", ob.tpot, false)) +
    card("Pareto: per user against total", pareto(sw)) +
    card("One reply under load (the probe)", probeBars(sw, G || {})) + `</div>`;
}

// A table of every level (vLLM's names in the hover).
export function table(snapshot, G) {
  G = G || {};
  const hover = (k) => (G[k] && G[k].hover) || k;
  const cols = [["request_rate", "offered req/s"], ["request_throughput", "req/s"], ["request_goodput", "goodput req/s"],
    ["output_throughput", "output tok/s"], ["output_throughput_per_user", "tok/s per user"], ["median_ttft_ms", "TTFT p50"],
    ["p90_ttft_ms", "TTFT p90"], ["p90_tpot_ms", "TPOT p90"], ["p90_itl_ms", "ITL p90"], ["p90_e2el_ms", "E2E p90"],
    ["p90_queue_ms", "queue p90"], ["completed", "done"], ["lost", "lost"], ["crossed", "crossed"], ["mismatched", "mismatched"], ["stuck", "stuck"]];
  const head = `<tr><th>max batch</th>${cols.map(([k, l]) => `<th title="${esc(hover(k))}">${esc(l)}</th>`).join("")}</tr>`;
  const body = snapshot.sweeps.flatMap((s) => s.levels.map((r, j) =>
    `<tr data-sweep-level="${j}"${s.knee_index === j ? ' class="lab-ol-knee-row"' : ""}><td>${esc(s.max_batch == null ? "—" : s.max_batch)}${s.knee_index === j ? " (knee)" : ""}</td>` +
    cols.map(([k]) => `<td>${esc(fmt(num(r[k])))}</td>`).join("") + `</tr>`)).join("");
  return body ? `<table class="lab-table lab-ol-table"><thead>${head}</thead><tbody>${body}</tbody></table>` : "";
}
