// The Load tab's statistics in the browser (ui/shell/format.js p50; ui/load/load_plots.js the judge's
// counts and each distribution's p50 mark) in Node, on made-up runs: pure.
import assert from "node:assert/strict";
import test from "node:test";

import { counts, distribution } from "../../ui/load/load_plots.js";
import { p50 } from "../../ui/shell/format.js";

const JUDGED = { complete: ["exact", "differs"], bad: ["lost", "crossed", "mismatched", "stuck"] };
const point = (outcome, ttft) => ({ outcome, ttft_ms: ttft });

test("p50 is the middle value, the mean of the middle two for an even count; unknowns left out", () => {
  assert.equal(p50([3, 1, 2]), 2);
  assert.equal(p50([4, 1, 3, 2]), 2.5);
  assert.equal(p50([null, 5, null]), 5);
  assert.equal(p50([]), null);
});

test("the judge's counts of a run: whole replies, failures, and anything else an error", () => {
  const run = { points: [point("exact"), point("exact"), point("differs"), point("crossed"), point("5xx"), point("cancelled")] };
  const c = counts(run, JUDGED);
  assert.deepEqual([c.requests, c.exact, c.differs, c.crossed, c.lost, c.errors], [6, 2, 1, 1, 0, 1]);
});

test("a distribution marks the p50 of whole replies only, and draws failures red", () => {
  const runs = [{ label: "max batch 1", points: [point("exact", 100), point("exact", 300), point("lost", 9000)] }];
  const svg = distribution(runs, "ttft_ms", {}, JUDGED);
  assert.match(svg, /<title>p50 200 ms<\/title>/);
  assert.equal((svg.match(/fill="#dc2626"/g) || []).length, 1);
});
