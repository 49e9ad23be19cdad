// The overlays' layout (ui/chat/overlays.js) in Node: where a reply's events fall on the browser's axis,
// the shared time scale, stalls, and the decimation that keeps a redraw cheap. Pure: no DOM.
import assert from "node:assert/strict";
import test from "node:test";

import { all, decimate, extent, niceMax, stalls, ticks, viewOf, waterfall } from "../../ui/chat/overlays.js";

// The server received the request at its 1,000,000 ms; the browser sent at its 500 ms with its clock
// 999,490 ms behind, so "received" is 10 ms after send.
const TIMELINE = { received_ns: 1e12, ttft_ms: 80, e2e_ms: 240, finish_reason: "stop",
  events_ms: { enqueued: 0.1, started: 2.1, setup_done: 5.1, prefill_start: 5.2 }, token_ms: [80, 100, 120, 140] };
const CLIENT = { send_at_ms: 500, clock_offset_ms: 1e6 - 510, clock_bound_ms: 0.4,
  arrival_ms: [95, 114, 133, 154], arrival_tokens: [1, 2, 3, 4], paint_ms: [101, 118, 135, 167] };
const close = (a, b) => assert.ok(Math.abs(a - b) < 1e-6, `${a} vs ${b}`);

test("server events land on the browser's axis through the clock offset", () => {
  const v = viewOf(TIMELINE, CLIENT, {});
  assert.equal(v.clockKnown, true);
  close(v.received, 10);
  assert.deepEqual(v.stages.network_in, [0, 10]);
  close(v.stages.queue[0], 10.1);
  close(v.stages.prefill[1], 90); // the first token, sampled at received + 80
  assert.equal(v.client_ttft_ms, 101);
  assert.equal(v.client_e2e_ms, 167);
  close(v.stages.paint_lag[1] - v.stages.paint_lag[0], 167 - 150); // last paint against its token
});

test("without a clock offset the server's stages start at 0 and the chart says so", () => {
  const v = viewOf(TIMELINE, { ...CLIENT, clock_offset_ms: null }, {});
  assert.equal(v.clockKnown, false);
  assert.equal(v.received, 0);
  assert.equal(v.stages.network_in, null);
  assert.match(waterfall(v, {}), /no clock offset yet/);
});

test("one time scale: the latest event of every view, rounded up", () => {
  const a = viewOf(TIMELINE, CLIENT, {});
  const b = viewOf({ ...TIMELINE, e2e_ms: 900 }, CLIENT, {});
  assert.equal(extent([a]), 250);
  assert.equal(extent([a, b]), 1000);
  assert.equal(niceMax(0), 1);
  assert.deepEqual(ticks(100, 4), [0, 25, 50, 75, 100]);
});

test("a stall is a paint gap past 50 ms and 4x the median gap", () => {
  const even = [[0, 1], [10, 2], [20, 3], [30, 4]];
  assert.deepEqual(stalls(even), []);
  const gap = [[0, 1], [10, 2], [20, 3], [120, 4], [130, 5]];
  assert.deepEqual(stalls(gap), [[20, 120]]);
});

test("at most two points per pixel column, the first and last of each kept", () => {
  const dense = Array.from({ length: 5000 }, (_, i) => [i / 10, i + 1]);
  const kept = decimate(dense, 500);
  assert.ok(kept.length <= 2 * 600 && kept.length >= 400, kept.length);
  assert.deepEqual(kept[0], dense[0]);
  assert.deepEqual(kept.at(-1), dense.at(-1));
  const sparse = [[0, 1], [100, 2]];
  assert.deepEqual(decimate(sparse, 500), sparse);
});

test("the four cards, the roofline under the waterfall, and no figure the reply did not report", () => {
  const html = all(viewOf(TIMELINE, CLIENT, {}), { glossary: {} });
  assert.equal((html.match(/<section class="lab-card">/g) || []).length, 4);
  assert.match(html, /class="lab-roof"/);
  assert.match(html, /no optimization figures reported/);
});
