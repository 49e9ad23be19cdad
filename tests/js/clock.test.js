// The clock offset (ui/chat/client_timing.js) and the SSE frames (ui/chat/sse_transport.js) in Node:
// the sample with the shortest round trip wins, old samples age out, a turn's request counts as one.
import assert from "node:assert/strict";
import test from "node:test";

import { bestSample, Clock, sample, SAMPLE_MAX_AGE_MS, SAMPLES_KEPT } from "../../ui/chat/client_timing.js";
import { parseFrame } from "../../ui/chat/sse_transport.js";

test("a sample's offset assumes the server answered halfway through the round trip", () => {
  assert.deepEqual(sample(100, 5060, 120), { rtt: 20, offset: 4950, at: 120 });
});

test("the shortest round trip among recent samples gives the offset; its half is the bound", () => {
  const samples = [sample(0, 1010, 20), sample(100, 1102, 104), sample(200, 1230, 260)];
  const { best, kept } = bestSample(samples, 300);
  assert.equal(kept.length, 3);
  assert.deepEqual(best, samples[1]);
  const clock = new Clock();
  for (const [t0, server, t1] of [[0, 1010, 20], [100, 1102, 104], [200, 1230, 260]]) clock.add(t0, server, t1);
  assert.equal(clock.offset, 1000);
  assert.equal(clock.bound, 2);
  assert.equal(clock.bestAt, 104);
});

test("samples older than the limit age out, and only the last ones are kept", () => {
  const old = sample(0, 1000, 2); // the best round trip, but too old by now
  const recent = sample(SAMPLE_MAX_AGE_MS, SAMPLE_MAX_AGE_MS + 1010, SAMPLE_MAX_AGE_MS + 20);
  const { best, kept } = bestSample([old, recent], SAMPLE_MAX_AGE_MS + 30);
  assert.deepEqual(kept, [recent]);
  assert.deepEqual(best, recent);
  const many = Array.from({ length: 50 }, (_, i) => sample(i, 1000 + i, i + 1 + (i % 7)));
  assert.equal(bestSample(many, 60).kept.length, SAMPLES_KEPT);
  assert.deepEqual(bestSample([], 0), { kept: [], best: null });
});

test("an SSE frame: its event and its data lines; comments skipped", () => {
  assert.deepEqual(parseFrame("event: chunk\ndata: {\"n\": 1}"), { event: "chunk", data: "{\"n\": 1}" });
  assert.deepEqual(parseFrame(": ping\r\ndata: a\r\ndata: b"), { event: "message", data: "a\nb" });
});
