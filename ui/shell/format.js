// Numbers and text as every drawing of the page shows them (the overlays, the Load tab's plots): pure.

export function esc(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

export const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);

export function fmtMs(v) {
  if (v == null || !isFinite(v)) return "—";
  const a = Math.abs(v);
  if (a >= 10000) return (v / 1000).toFixed(1) + " s";
  if (a >= 10) return Math.round(v).toLocaleString("en-US") + " ms";
  return v.toFixed(1) + " ms";
}

export function fmtInt(v) { return v == null ? "—" : Math.round(v).toLocaleString("en-US"); }

// A round axis maximum (1, 2, 2.5, 5 × 10^k) at or above v.
export function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v * 0.999) return m * p;
  return 10 * p;
}

// Round tick values from 0 to max, about `count` of them.
export function ticks(max, count) {
  const step = niceMax(max / (count || 4));
  const out = [];
  for (let t = 0; t <= max + 1e-9; t += step) out.push(t);
  return out;
}

// The median of the known values (the mean of the middle two for an even count); null when none.
export function p50(xs) {
  const s = xs.filter((v) => v != null).sort((a, b) => a - b);
  if (!s.length) return null;
  const m = (s.length - 1) / 2;
  return (s[Math.floor(m)] + s[Math.ceil(m)]) / 2;
}
