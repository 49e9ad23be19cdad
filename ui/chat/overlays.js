// Latency Lab overlays: pure functions from one reply's data to SVG/HTML strings.
//
// No DOM access and no globals, so they can be tested with synthetic data (tests/ui_browser/test_ui_overlays_js.py
// runs them in Chromium) and redrawn while a reply streams. Every time is ms since the user
// pressed send, on the browser's axis; server events are placed on it through the clock offset
// (when no offset is known, the server's "received" is drawn at 0 and the chart says so).
// Why hand-written SVG and not Plotly: a redraw here costs well under a millisecond for a few
// hundred tokens (the page measures and shows it), and it runs while tokens stream; a Plotly
// figure through gr.Plot is a server round trip plus a full re-layout per update.
import { esc, fmtInt, fmtMs, niceMax, num, ticks } from "../shell/format.js";
import { NET_STAGES, netStages } from "./net_phases.js";
import { bars as rooflineBars } from "./roofline.js";

export { fmtMs, niceMax, ticks };

const W = 600;          // viewBox width; the SVG scales to its container
const LEFT = 132;       // room for row labels
const RIGHT = 12;
const COLORS = {
  network: "#94a3b8", queue: "#f59e0b", setup: "#a78bfa", prefill: "#6366f1", decode: "#0ea5e9",
  paint: "#10b981", server: "#6366f1", arrival: "#f59e0b", painted: "#10b981", pace: "#64748b",
  stall: "#ef4444", thought: "#f59e0b", cached: "#10b981", prefilled: "#6366f1", drafted: "#cbd5e1", accepted: "#0ea5e9",
};

const last = (xs) => (xs && xs.length ? xs[xs.length - 1] : null);

// ---- the view: one reply's data on the browser's axis ---------------------------------------
// timeline: Timeline.to_dict() or the live subset the page keeps while streaming
//   ({received_ns, events_ms, token_ms}); client: {send_at_ms, arrival_ms, arrival_tokens,
//   paint_ms, clock_offset_ms, clock_bound_ms}; opts: {now, readingPace}.
export function viewOf(timeline, client, opts) {
  const tl = timeline || {};
  const c = client || {};
  const o = opts || {};
  const clockKnown = num(c.clock_offset_ms) != null && num(c.send_at_ms) != null && num(tl.received_ns) != null;
  const rec = clockKnown ? tl.received_ns / 1e6 - c.clock_offset_ms - c.send_at_ms : 0;
  const at = (rel) => (num(rel) == null ? null : rec + rel);
  const ev = tl.events_ms || {};
  const tok = tl.token_ms || [];
  const arrival = c.arrival_ms || [];
  const arrivalTokens = c.arrival_tokens || arrival.map((_, i) => i + 1);
  const paintMs = c.paint_ms || [];
  const painted = [];
  paintMs.forEach((t, i) => { if (num(t) != null) painted.push([t, arrivalTokens[i]]); });
  const firstTok = tok.length ? tok[0] : null;
  const lastTok = last(tok);
  // the server time of the token behind the last painted text (a final end-of-sequence chunk
  // paints nothing, so the last token is the wrong reference for the paint lag)
  let lastPaintedTok = null;
  paintMs.forEach((t, i) => { if (num(t) != null && arrivalTokens[i] > 0) lastPaintedTok = tok[arrivalTokens[i] - 1]; });
  return {
    clockKnown,
    clockBound: num(c.clock_bound_ms),
    received: rec,
    stages: {
      network_in: clockKnown ? [0, rec] : null,
      ...netStages(tl, at), // a remote reply's network phases: sub-stages of network in
      queue: [at(ev.enqueued), at(ev.started)],
      setup: [at(ev.started), at(ev.setup_done)],
      prefill: [at(num(ev.prefill_start) != null ? ev.prefill_start : ev.setup_done), at(firstTok)],
      thinking: num(ev.thought_first) != null ? [at(ev.thought_first), at(ev.thought_end)] : null,
      decode: [at(firstTok), at(lastTok)],
      network_out: [at(firstTok), painted.length ? painted[0][0] : null],
      paint_lag: tl.finish_reason ? [at(lastPaintedTok), painted.length ? last(painted)[0] : null] : null,
    },
    ttft_ms: num(tl.ttft_ms) != null ? tl.ttft_ms : firstTok,
    e2e_ms: num(tl.e2e_ms),
    client_ttft_ms: painted.length ? painted[0][0] : null,
    client_e2e_ms: tl.finish_reason && painted.length ? last(painted)[0] : null,
    // a reply that opens with a thought: [start, end] of the thought and the answer's first token, on this
    // axis, as the server sampled them and as the browser painted them (ui/chat/client_timing.js)
    thought: {
      server: num(ev.thought_first) != null ? [at(ev.thought_first), at(ev.thought_end)] : null,
      serverAnswer: num(ev.thought_first) != null ? at(ev.answer_first) : null,
      browser: num(c.client_ttft_thought_ms) != null
        ? [c.client_ttft_thought_ms, num(c.client_thinking_ms) != null ? c.client_ttft_thought_ms + c.client_thinking_ms : null] : null,
      browserAnswer: num(c.client_ttft_thought_ms) != null ? num(c.client_ttfa_ms) : null,
    },
    serverTokens: tok.map((t, i) => [rec + t, i + 1]),
    arrival: arrival.map((t, i) => [t, arrivalTokens[i]]),
    paint: painted,
    now: num(o.now),
    finished: !!tl.finish_reason,
    readingPace: num(o.readingPace) != null ? o.readingPace : 5.3,
    roofline: Object.assign({}, tl.roofline || {}, {  // each stage against the machine's limit (ui/chat/roofline.js)
      prefill_tflops: num(tl.prefill_tflops), prefill_compute_fraction: num(tl.prefill_compute_fraction),
      decode_gbps: num(tl.decode_gbps), decode_bandwidth_fraction: num(tl.decode_bandwidth_fraction),
      decode_mb_per_token: num(tl.decode_bytes_per_token) ? tl.decode_bytes_per_token / 1e6 : null,
      finished: !!tl.finish_reason, remote: tl.measured_at === "client",
    }),
    counters: {
      prompt_tokens: num(tl.prompt_tokens), cached_tokens: num(tl.cached_tokens),
      prefill_tokens: num(tl.prefill_tokens), drafted: num(tl.drafted), accepted: num(tl.accepted),
      acceptance_rate: num(tl.acceptance_rate), tokens_per_step: num(tl.tokens_per_step),
      accepted_hist: Array.isArray(tl.accepted_hist) ? tl.accepted_hist : null,
      backoffs: num(tl.backoffs), k_change_count: num(tl.k_change_count), k_changes: Array.isArray(tl.k_changes) ? tl.k_changes : null,
      weight_mb: num(tl.weight_bytes) ? tl.weight_bytes / 1e6 : null,
      variant: o.variant || null,
    },
  };
}

// The right end of the shared time axis: the latest event of the view(s), rounded up.
export function extent(views) {
  let m = 0;
  for (const v of views) {
    if (!v) continue;
    const cands = [v.now, v.received + (v.e2e_ms || 0), v.client_e2e_ms, last(v.paint) && last(v.paint)[0],
      last(v.arrival) && last(v.arrival)[0], last(v.serverTokens) && last(v.serverTokens)[0]];
    for (const s of Object.values(v.stages)) if (s) cands.push(s[1]);
    for (const x of cands) if (num(x) != null && x > m) m = x;
  }
  return niceMax(m || 100);
}

function xScale(xMax) { return (t) => LEFT + (Math.max(0, t) / xMax) * (W - LEFT - RIGHT); }

function axis(xMax, y, height) {
  const x = xScale(xMax);
  let s = "";
  const ts = ticks(xMax, 5);
  ts.forEach((t, i) => {
    const anchor = i === ts.length - 1 ? "end" : i === 0 ? "start" : "middle"; // keep labels inside
    s += `<line x1="${x(t)}" x2="${x(t)}" y1="${y - height}" y2="${y}" class="lab-grid"/>`;
    s += `<text x="${x(t)}" y="${y + 12}" class="lab-tick" text-anchor="${anchor}">${esc(fmtMs(t))}</text>`;
  });
  return s;
}

function bar(x0, x1, y, h, color, title, label) {
  const w = Math.max(1.5, x1 - x0);
  let s = `<rect x="${x0.toFixed(1)}" y="${y}" width="${w.toFixed(1)}" height="${h}" rx="2" fill="${color}"><title>${esc(title)}</title></rect>`;
  if (label) {
    const inside = w > label.length * 6.2 + 8;
    const tx = inside ? x0 + 4 : x0 + w + 4;
    const flip = !inside && tx > W - 60;
    s += `<text x="${flip ? x0 - 4 : tx}" y="${y + h - 3}" class="lab-barlabel${inside ? " in" : ""}" text-anchor="${flip ? "end" : "start"}">${esc(label)}</text>`;
  }
  return s;
}

function svg(height, body, label) {
  return `<svg class="lab-svg" viewBox="0 0 ${W} ${height}" role="img" aria-label="${esc(label)}">${body}</svg>`;
}

// ---- 1. TTFT vs total: server and browser ----------------------------------------------------
export function ttftVsTotal(v, opts) {
  const G = (opts && opts.glossary) || {};
  const xMax = (opts && opts.xMax) || extent([v]);
  const x = xScale(xMax);
  const rows = [
    { name: "server", start: v.received, ttft: v.ttft_ms, total: v.e2e_ms, keys: ["ttft_ms", "e2e_ms", "thinking_ms", "ttfa_ms"],
      thought: v.thought && v.thought.server, answer: v.thought && v.thought.serverAnswer },
    { name: "browser", start: 0, ttft: v.client_ttft_ms, total: v.client_e2e_ms, keys: ["client_ttft_ms", "client_e2e_ms", "client_thinking_ms", "client_ttfa_ms"],
      thought: v.thought && v.thought.browser, answer: v.thought && v.thought.browserAnswer },
  ];
  let body = axis(xMax, 74, 70);
  rows.forEach((r, i) => {
    const y = 10 + i * 30;
    body += `<text x="${LEFT - 8}" y="${y + 14}" class="lab-rowlabel" text-anchor="end">${r.name}</text>`;
    const liveEnd = v.finished ? null : v.now;
    const totalEnd = r.total != null ? r.start + r.total : (r.ttft != null ? liveEnd : null);
    if (r.ttft == null && liveEnd != null) {  // still waiting for the first token: a growing wait bar
      body += bar(x(r.start), x(liveEnd), y + 4, 12, "#e2e8f0", "waiting for the first token", "waiting…");
      return;
    }
    if (totalEnd != null) body += bar(x(r.start), x(totalEnd), y + 2, 16, "#cbd5e1", hov(G, r.keys[1]), "");
    if (r.ttft != null) {
      const ttftEnd = r.name === "server" ? r.start + r.ttft : r.ttft;
      body += bar(x(r.start), x(ttftEnd), y + 2, 16, r.name === "server" ? COLORS.server : COLORS.painted, hov(G, r.keys[0]), "");
      let label = `TTFT ${fmtMs(r.ttft)}`;
      if (r.thought) {  // the thought as its own band, the answer's first token marked
        const t1 = r.thought[1] != null ? r.thought[1] : liveEnd;
        if (t1 != null) body += `<rect class="lab-thought-band" x="${x(r.thought[0]).toFixed(1)}" y="${y + 2}" width="${Math.max(1.5, x(t1) - x(r.thought[0])).toFixed(1)}" height="16" fill="${COLORS.thought}" opacity="0.75"><title>${esc(hov(G, r.keys[2]))}</title></rect>`;
        if (r.answer != null) body += `<line class="lab-answer-mark" x1="${x(r.answer)}" x2="${x(r.answer)}" y1="${y}" y2="${y + 20}" stroke="#0f172a" stroke-width="2"><title>${esc(hov(G, r.keys[3]))}</title></line>`;
        label = r.answer != null ? `answer ${fmtMs(r.answer - r.start)}` : (r.thought[1] == null ? "thinking…" : "thought");
        if (r.thought[1] != null) label = `thought ${fmtMs(r.thought[1] - r.thought[0])} · ` + label;
      }
      label += r.total != null ? ` · total ${fmtMs(r.total)}` : " · streaming…";
      const tx = Math.min(x(ttftEnd) + 6, W - 8);
      body += `<text x="${tx}" y="${y + 14}" class="lab-barlabel" text-anchor="${tx > W - 170 ? "end" : "start"}"><title>${esc(hov(G, r.keys[0]))}</title>${esc(label)}</text>`;
    }
  });
  return svg(90, body, "TTFT vs total completion time, server and browser");
}

function hov(G, key) { return (G[key] && G[key].hover) || key; }

// ---- 2. stage waterfall ----------------------------------------------------------------------
const STAGES = [
  ["network_in", "network in", "network", "network_in_ms"],
  ...NET_STAGES.map(([key, label, metric]) => [key, label, "network", metric]),
  ["net_reused", "· connection reused", "network", "connection_reused"],
  ["queue", "queue", "queue", "queue_ms"],
  ["setup", "setup", "setup", "setup_ms"],
  ["prefill", "prefill", "prefill", "prefill_ms"],
  ["thinking", "thinking", "thought", "thinking_ms"],
  ["decode", "decode", "decode", "decode_ms"],
  ["network_out", "network out + paint", "paint", "network_out_ms"],
  ["paint_lag", "last paint lag", "paint", "paint_lag_ms"],
];

export function waterfall(v, opts) {
  const G = (opts && opts.glossary) || {};
  const xMax = (opts && opts.xMax) || extent([v]);
  const x = xScale(xMax);
  const rowH = 19;
  const rows = STAGES.filter(([key]) => v.stages[key] !== null && v.stages[key] !== undefined);
  const height = rows.length * rowH + 24;
  let body = axis(xMax, height - 16, height - 16);
  rows.forEach(([key, label, color, metric], i) => {
    const y = 4 + i * rowH;
    const [s, e0] = v.stages[key];
    const live = e0 == null && s != null && !v.finished && v.now != null && key !== "network_out";
    const e = e0 != null ? e0 : (live ? v.now : null);
    const cross = key === "network_in" || key === "network_out" || key === "paint_lag";
    const bound = cross && v.clockBound != null ? ` ±${fmtMs(v.clockBound)}` : "";
    body += `<text x="${LEFT - 8}" y="${y + 13}" class="lab-rowlabel" text-anchor="end"><title>${esc(hov(G, metric))}</title>${esc(label)}</text>`;
    if (s == null || e == null) {
      const note = key === "net_reused" ? "no DNS, connect or TLS: a kept-alive connection" : key === "network_out" && !v.finished ? "…" : "—";
      body += `<text x="${LEFT + 4}" y="${y + 13}" class="lab-muted">${note}</text>`;
      return;
    }
    const ms = e - s;
    const text = (live ? "" : fmtMs(ms) + bound) || "…";
    body += bar(x(s), x(e), y + 3, rowH - 6, COLORS[color], `${hov(G, metric)}: ${fmtMs(ms)}${bound}`, text);
  });
  if (!v.clockKnown) {
    body += `<text x="${W - RIGHT}" y="${height - 2}" class="lab-muted" text-anchor="end">no clock offset yet: server stages start at 0</text>`;
  }
  return svg(height, body, "Stage waterfall");
}

// ---- 3. token timeline -----------------------------------------------------------------------
// Gaps in the painted text longer than max(minMs, factor × median gap): what a reader sees as a stall.
export function stalls(points, minMs, factor) {
  if (!points || points.length < 3) return [];
  const gaps = [];
  for (let i = 1; i < points.length; i++) gaps.push([points[i - 1][0], points[i][0]]);
  const sorted = gaps.map(([a, b]) => b - a).sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)];
  const limit = Math.max(minMs == null ? 50 : minMs, (factor || 4) * median);
  return gaps.filter(([a, b]) => b - a > limit);
}

// At most two points per pixel column (the first and last in it): a step line looks the same,
// and a redraw stays cheap however many tokens a reply has.
function decimateTo(points, x) {
  if (points.length < 2 * (W - LEFT)) return points;
  const out = [];
  let col = null, lastInCol = null;
  for (const p of points) {
    const c = Math.round(x(p[0]));
    if (c !== col) {
      if (lastInCol && lastInCol !== out[out.length - 1]) out.push(lastInCol);
      out.push(p);
      col = c;
      lastInCol = null;
    } else {
      lastInCol = p;
    }
  }
  if (lastInCol) out.push(lastInCol);
  return out;
}

function stepPath(points, x, y) {
  points = decimateTo(points, x);
  if (!points.length) return "";
  let d = `M${x(points[0][0]).toFixed(1)},${y(0).toFixed(1)}`;
  let prevY = 0;
  for (const [t, n] of points) {
    const px = x(t).toFixed(1);
    d += `L${px},${y(prevY).toFixed(1)}L${px},${y(n).toFixed(1)}`;
    prevY = n;
  }
  return d;
}

export function tokenTimeline(v, opts) {
  const G = (opts && opts.glossary) || {};
  const xMax = (opts && opts.xMax) || extent([v]);
  const height = 170, top = 8, bottom = height - 20;
  const x = xScale(xMax);
  const maxTok = Math.max(4, (last(v.serverTokens) || [0, 0])[1], (last(v.arrival) || [0, 0])[1]);
  const yMax = niceMax(maxTok);
  const y = (n) => bottom - (n / yMax) * (bottom - top);
  let body = axis(xMax, bottom, bottom - top);
  for (const n of ticks(yMax, 3)) {
    body += `<text x="${LEFT - 8}" y="${y(n) + 3}" class="lab-tick" text-anchor="end">${fmtInt(n)}</text>`;
  }
  for (const [a, b] of stalls(v.paint)) {
    body += `<rect x="${x(a)}" y="${top}" width="${Math.max(1, x(b) - x(a))}" height="${bottom - top}" fill="${COLORS.stall}" opacity="0.12"><title>stall: ${esc(fmtMs(b - a))} with no new text painted</title></rect>`;
  }
  const band = v.thought && v.thought.browser;
  if (band && (band[1] != null || v.now != null)) {  // while the browser showed the reply thinking
    const b1 = band[1] != null ? band[1] : v.now;
    body += `<rect class="lab-thought-band" x="${x(band[0])}" y="${top}" width="${Math.max(1, x(b1) - x(band[0]))}" height="${bottom - top}" fill="${COLORS.thought}" opacity="0.15"><title>thinking (browser): ${esc(fmtMs(b1 - band[0]))} from the first thought painted to its end painted</title></rect>`;
  }
  if (v.paint.length && v.readingPace > 0) {  // a reader starting at the first painted text
    const t0 = v.paint[0][0];
    const t1 = Math.min(xMax, t0 + (yMax / v.readingPace) * 1000);
    body += `<line x1="${x(t0)}" y1="${y(0)}" x2="${x(t1)}" y2="${y(((t1 - t0) / 1000) * v.readingPace)}" stroke="${COLORS.pace}" stroke-dasharray="4 3" stroke-width="1.2"><title>reading pace: ${v.readingPace} tok/s from the first painted text; a stream above this line stays ahead of its reader</title></line>`;
  }
  const series = [
    ["server", v.serverTokens, "server emit (token sampled)"],
    ["arrival", v.arrival, "browser arrival (chunk received)"],
    ["painted", v.paint, "browser paint (next frame after the DOM change)"],
  ];
  for (const [key, pts, title] of series) {
    if (!pts.length) continue;
    body += `<path d="${stepPath(pts, x, y)}" fill="none" stroke="${COLORS[key]}" stroke-width="1.6"><title>${esc(title)}</title></path>`;
  }
  if (v.now != null && !v.finished) {
    body += `<line x1="${x(v.now)}" x2="${x(v.now)}" y1="${top}" y2="${bottom}" class="lab-now"/>`;
  }
  return svg(height, body, "Cumulative tokens over time: server emit, browser arrival, paint");
}

function legend() {
  const item = (color, label, dash) => `<span class="lab-key"><i style="background:${dash ? "none" : color};${dash ? `border-top:2px dashed ${color};height:0;` : ""}"></i>${esc(label)}</span>`;
  return `<div class="lab-legend">${item(COLORS.server, "server emit")}${item(COLORS.arrival, "arrival")}${item(COLORS.painted, "paint")}${item(COLORS.pace, "reading pace", true)}${item(COLORS.stall, "stall")}</div>`;
}

// ---- 4. optimization effects -----------------------------------------------------------------
function stacked(parts, title) {
  const total = parts.reduce((a, p) => a + (p[1] || 0), 0);
  if (!total) return "";
  return `<div class="lab-stack" title="${esc(title)}">` + parts.filter((p) => p[1]).map(([label, n, color]) =>
    `<span style="flex:${n};background:${color}" title="${esc(label)}: ${fmtInt(n)}"></span>`).join("") + "</div>";
}

export function effects(v, opts) {
  const G = (opts && opts.glossary) || {};
  const c = v.counters;
  const rows = [];
  if (c.prompt_tokens != null) {
    const cached = c.cached_tokens || 0;
    const pre = c.prefill_tokens != null ? c.prefill_tokens : c.prompt_tokens - cached;
    rows.push(`<div class="lab-effect"><b title="${esc(hov(G, "cached_tokens"))}">prompt</b>` +
      `<span>${fmtInt(cached)} cached · ${fmtInt(pre)} prefilled</span>` +
      stacked([["cached", cached, COLORS.cached], ["prefilled", pre, COLORS.prefilled]], hov(G, "cached_tokens")) + "</div>");
  }
  if (c.drafted != null) {
    const rate = c.acceptance_rate != null ? c.acceptance_rate : (c.drafted ? (c.accepted || 0) / c.drafted : null);
    let h = `<div class="lab-effect"><b title="${esc(hov(G, "acceptance_rate"))}">speculation</b>` +
      `<span>${fmtInt(c.accepted)} of ${fmtInt(c.drafted)} drafts accepted` +
      (rate != null ? ` (${Math.round(rate * 100)}%)` : "") +
      (c.tokens_per_step != null ? ` · ${c.tokens_per_step.toFixed(2)} tok/step` : "") + "</span>" +
      stacked([["accepted", c.accepted || 0, COLORS.accepted], ["rejected", (c.drafted || 0) - (c.accepted || 0), COLORS.drafted]], hov(G, "acceptance_rate"));
    if (c.k_changes && c.k_changes.length) {  // adaptive speculation: when it guessed fewer or none
      const last = c.k_changes[c.k_changes.length - 1];
      h += `<div class="lab-muted" title="adaptive speculation changes k when guesses stop (or start) paying; k=0 means it stopped guessing">` +
        `k changed ${fmtInt(c.k_change_count != null ? c.k_change_count : c.k_changes.length)}× (backed off to none ${fmtInt(c.backoffs || 0)}×), last k=${fmtInt(last.k)} at token ${fmtInt(last.token)}</div>`;
    }
    if (c.accepted_hist && c.accepted_hist.length) {
      const max = Math.max(...c.accepted_hist, 1);
      h += `<div class="lab-hist" title="verify steps by number of accepted drafts (0, 1, 2, …)">` + c.accepted_hist.map((n, k) =>
        `<span style="height:${Math.max(2, (n / max) * 32)}px" title="${fmtInt(n)} steps accepted ${k}"><em>${k}</em></span>`).join("") + "</div>";
    }
    rows.push(h + "</div>");
  }
  if (c.weight_mb != null || c.variant) {
    rows.push(`<div class="lab-effect"><b title="${esc(hov(G, "weight_mb"))}">weights</b><span>${esc(c.variant || "default")}` +
      (c.weight_mb != null ? ` · ${fmtInt(c.weight_mb)} MB` : "") + "</span></div>");
  }
  if (!rows.length) return `<div class="lab-muted">no optimization figures reported for this reply</div>`;
  return rows.join("");
}

// ---- all four, as the page shows them ----------------------------------------------------------
function card(title, hint, inner) {
  return `<section class="lab-card"><h4 title="${esc(hint)}">${esc(title)}</h4>${inner}</section>`;
}

export function all(v, opts) {
  const o = Object.assign({}, opts || {});
  o.xMax = o.xMax || extent([v]);
  return card("TTFT vs total", "time to first token and total completion time, as the server measured them and as the browser perceived them", ttftVsTotal(v, o)) +
    card("Where the time went", "each stage on one axis: ms since you pressed send (browser clock; server stages placed through the clock offset)", waterfall(v, o) +
      rooflineBars(v.roofline, o.glossary)) +
    card("Token timeline (tokens vs time)", "cumulative tokens over time: when the server sampled them, when the browser received them, when they were painted", tokenTimeline(v, o) + legend()) +
    card("Optimization effects", "what the toggles did to this reply", effects(v, o));
}

// At most two points per pixel column of a chart `xMax` wide (tests call it so).
export const decimate = (pts, xMax) => decimateTo(pts, xScale(xMax));
