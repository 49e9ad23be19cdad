// Latency Lab roofline: each stage of a reply against the machine's measured limit.
//
// Prefill is compute-bound: its bar is prefill_tflops against the matmul peak of its dtype.
// Decode is memory-bound: its bar is decode_gbps against the read bandwidth (a decode step reads its
// weights and writes next to nothing). Both limits come from the one probe of this machine
// (engine/measure/machine_limits.py, via the reply's timings.roofline; the header shows them and re-measures).
// Pure HTML strings from numbers (no model text); the header re-measures them (ui/shell/header.js).
import { esc, num } from "../shell/format.js";

const pct = (f) => (f < 0.1 ? (100 * f).toFixed(1) : Math.round(100 * f)) + "%";
const g3 = (v) => (v >= 100 ? Math.round(v).toLocaleString("en-US") : v.toPrecision(3));

// r: {prefill_tflops, prefill_compute_fraction, peak_tflops, peak_unit (the engine's: TFLOP/s, or TOP/s for
//     an int8 roof), compute_dtype, decode_gbps,
//     decode_bandwidth_fraction, read_gbps, limits_date, limits_note, kv_cache_dtype, kv_bytes_per_position,
//     decode_mb_per_token, finished, remote}
// A fraction above 100% is never printed: the limit is stale (the engine re-measures it when idle and says
// so in limits_note: engine/measure/roofline.py), or the step's bytes came from the cache.
function row(stage, label, value, limit, unit, fraction, hover, why, note) {
  const known = value != null;
  const above = fraction != null && fraction > 1;
  const f = fraction != null ? Math.max(0, Math.min(1, fraction)) : 0;
  const stale = note || "above the measured limit: limit stale; re-measure when the machine is idle";
  const text = !known ? "—" : `${g3(value)}` + (limit == null ? ` ${unit} (no measured limit)` :
    above ? ` ${unit}: ${stale}` : ` of ${g3(limit)} ${unit} (${pct(fraction)})`);
  const over = above ? " — " + stale : "";
  return `<div class="lab-roof-row${over ? " lab-roof-over" : ""}" data-stage="${stage}" title="${esc(hover + (known ? "" : " — unknown: " + why) + over)}">` +
    `<b>${esc(label)}</b><span class="lab-roof-track"><span class="lab-roof-bar lab-roof-${stage}" style="width:${(100 * f).toFixed(1)}%"></span></span>` +
    `<span class="lab-roof-val">${esc(text)}</span></div>`;
}

export function bars(r, G) {
  r = r || {};
  G = G || {};
  const hov = (k) => (G[k] && G[k].hover) || k;
  const pending = r.finished ? null : "the figures come with the reply's last token";
  const why = (stage) => pending || (r.remote ? "a remote backend: its model shape, weights and machine are unknown here" :
    stage === "decode" ? "no decode step, or no weight bytes for this reply" : "no model shape for this reply");
  const perTok = num(r.decode_mb_per_token);
  return `<div class="lab-roof" title="each stage against the machine's measured limit">` +
    row("prefill", "prefill: compute", num(r.prefill_tflops), num(r.peak_tflops),
      `${r.peak_unit || ""}${r.compute_dtype ? " " + r.compute_dtype : ""} matmul`, num(r.prefill_compute_fraction), hov("prefill_compute_fraction"), why("prefill"), r.limits_note) +
    row("decode", "decode: memory", num(r.decode_gbps), num(r.read_gbps), "GB/s read",
      num(r.decode_bandwidth_fraction), hov("decode_bandwidth_fraction"), why("decode"), r.limits_note) +
    (perTok != null ? `<div class="lab-muted lab-roof-note" title="${esc(hov("decode_mb_per_token"))}">decode read ${g3(perTok)} MB per token` +
      (num(r.kv_bytes_per_position) != null ? `<span title="${esc(hov("kv_bytes_per_position"))}"> (KV ${g3(r.kv_bytes_per_position / 1024)} KB per token of context, ${esc(r.kv_cache_dtype || "model")})</span>` : "") + `</div>` : "") +
    (r.limits_note && !(num(r.decode_bandwidth_fraction) > 1 || num(r.prefill_compute_fraction) > 1) ?
      `<div class="lab-muted lab-roof-note lab-roof-limits">${esc(r.limits_note)}</div>` : "") +
    "</div>";
}
