// A remote reply's network phases (engine/remote/network.py: the Timeline's `net_*` spans) as sub-stages
// of "network in" in the overlays' waterfall: DNS, connect, TLS, request sent, response headers. Only
// the phases that ran are rows: a kept-alive connection has no DNS, connect or TLS, and says so. Pure.

// [stage key, row label, glossary metric]
export const NET_STAGES = [
  ["net_dns", "· DNS", "net_dns_ms"],
  ["net_connect", "· connect", "net_connect_ms"],
  ["net_tls", "· TLS handshake", "net_tls_ms"],
  ["net_send", "· request sent", "net_send_ms"],
  ["net_headers", "· response headers", "net_headers_ms"],
];

// {net_dns: [start, end], …} on the browser's axis (`at`: ms after the server received → that axis), the
// chat request's own spans where there are any (else every exchange's, e.g. the session's POST), and
// net_reused: [null, null] when the request opened no connection.
export function netStages(tl, at) {
  const spans = (tl.spans_ms || []).filter((s) => typeof s.name === "string" && s.name.startsWith("net_"));
  const out = {};
  for (const [key] of NET_STAGES) {
    const mine = spans.filter((s) => s.name === key);
    const chat = mine.filter((s) => s.exchange === "chat");
    const use = chat.length ? chat : mine;
    if (use.length) out[key] = [at(Math.min(...use.map((s) => s.start_ms))), at(Math.max(...use.map((s) => s.end_ms)))];
  }
  if (tl.connection_reused === true) out.net_reused = [null, null];
  return out;
}
