// The smoothing schedule (ui/chat/smooth.js) on synthetic arrival traces: no engine, no browser.
// Run by tests/test_ui_js.py (`node --test tests/js/`).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import test from "node:test";

import { simulate, Smoother } from "../../ui/chat/smooth.js";

const FRAME = 1000 / 60;

// A small seeded PRNG (mulberry32), so every trace is the same on every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = ["the", "model", "verifies", "several", "drafted", "tokens", "in", "one", "pass", "and", "a",
  "reader", "sees", "bursts", "unless", "smoothed", "text", "arrives"];

// Speculative decoding as the page sees it: a step every 30-90 ms yields 1-5 tokens at one instant;
// a token is a word with its leading space, or half a word.
function bursty(seed, steps, startMs) {
  const r = rng(seed);
  const trace = [];
  let t = startMs || 200, tokens = 0;
  for (let i = 0; i < steps; i++) {
    t += 30 + 60 * r();
    const k = 1 + Math.floor(5 * r());
    let text = "";
    for (let j = 0; j < k; j++) {
      const w = WORDS[Math.floor(r() * WORDS.length)];
      text += r() < 0.8 ? " " + w : w.slice(0, 2);
    }
    tokens += k;
    trace.push([t, text, tokens]);
  }
  return trace;
}

function steady(gapMs, n, startMs) {
  return Array.from({ length: n }, (_, i) => [(startMs || 100) + i * gapMs, " " + WORDS[i % WORDS.length], i + 1]);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const joined = (xs) => xs.map((x) => x[1]).join("");
const gaps = (rel) => rel.slice(1).map((x, i) => x[0] - rel[i][0]);
function cv(xs) {
  const m = xs.reduce((a, b) => a + b, 0) / xs.length;
  const sd = Math.sqrt(xs.reduce((a, b) => a + (b - m) ** 2, 0) / xs.length);
  return sd / m;
}

// When each character of the reply arrived, and when it was released.
function perChar(trace, releases) {
  const arrived = [], released = [];
  for (const [t, text] of trace) for (let i = 0; i < text.length; i++) arrived.push(t);
  for (const [t, text] of releases) for (let i = 0; i < text.length; i++) released.push(t);
  return { arrived, released };
}

const TRACES = {
  bursty: bursty(1, 120),
  bursty2: bursty(7, 60),
  steady: steady(20, 100),
  pause: [...steady(20, 30), ...steady(20, 30, 100 + 30 * 20 + 900)], // a 0.9 s stall mid-reply
  speedup: [...steady(120, 10), ...steady(8, 100, 100 + 10 * 120)],
  slowdown: [...steady(8, 100), ...steady(120, 10, 100 + 100 * 8)],
};
const CONFIGS = [];
for (const mode of ["off", "adaptive", "pace"]) for (const unit of ["word", "char"]) CONFIGS.push({ mode, unit, paceTps: 40 });

test("no mode reorders, drops, duplicates or releases text before it arrived", () => {
  for (const [name, trace] of Object.entries(TRACES)) {
    for (const opts of CONFIGS) {
      const rel = simulate(trace, opts, FRAME);
      assert.equal(joined(rel), joined(trace), `${name} ${opts.mode}/${opts.unit}: text differs`);
      const { arrived, released } = perChar(trace, rel);
      released.forEach((t, i) => assert.ok(t >= arrived[i], `${name} ${opts.mode}/${opts.unit}: char ${i} early`));
      gaps(rel).forEach((g) => assert.ok(g > 0, "one release per frame, in time order"));
    }
  }
});

test("off releases everything at the first frame after it arrived", () => {
  const trace = TRACES.bursty;
  const rel = simulate(trace, { mode: "off" }, FRAME);
  const { arrived, released } = perChar(trace, rel);
  released.forEach((t, i) => assert.ok(t - arrived[i] < FRAME, `char ${i} waited ${t - arrived[i]} ms`));
});

test("adaptive holds no text longer than maxHoldMs after it arrived, so none long after the last arrival", () => {
  for (const maxHoldMs of [50, 150, 400]) {
    for (const [name, trace] of Object.entries(TRACES)) {
      for (const unit of ["word", "char"]) {
        // the stream's end is announced late (the done event can trail the last chunk)
        const rel = simulate(trace, { mode: "adaptive", unit, maxHoldMs }, FRAME, 0, trace.at(-1)[0] + 1000);
        const { arrived, released } = perChar(trace, rel);
        released.forEach((t, i) => assert.ok(t - arrived[i] <= maxHoldMs + FRAME,
          `${name} ${unit} hold ${maxHoldMs}: char ${i} waited ${(t - arrived[i]).toFixed(1)} ms`));
        assert.ok(rel.at(-1)[0] - trace.at(-1)[0] <= maxHoldMs + FRAME, `${name}: held back after the last arrival`);
      }
    }
  }
});

// The page's paint-interval smoothness (ui/chat/records.py, paint_gap_cv / paint_gap_max_ms): gaps
// between successive words appearing (a word appears when its last character is painted).
function wordGaps(releases) {
  const text = joined(releases);
  const at = [];
  for (const [t, x] of releases) for (let i = 0; i < x.length; i++) at.push(t);
  const shown = [];
  for (let i = 0; i < text.length; i++) if (/\S/.test(text[i]) && (i + 1 === text.length || /\s/.test(text[i + 1]))) shown.push(at[i]);
  return gaps(shown.map((t) => [t]));
}

// Real bursts: three replies with prompt-lookup speculation, as they left the engine on this CPU.
const RECORDED = JSON.parse(readFileSync(new URL("./traces/prompt_lookup_cpu.json", import.meta.url))).traces;

test("adaptive evens out bursty streams: words appear at steadier intervals, stalls are no longer", () => {
  const traces = [["bursty", TRACES.bursty], ["bursty2", TRACES.bursty2], ...RECORDED.map((r) => [r.name, r.chunks])];
  for (const [name, trace] of traces) {
    const off = wordGaps(simulate(trace, { mode: "off" }, FRAME));
    for (const unit of ["word", "char"]) {
      const smooth = wordGaps(simulate(trace, { mode: "adaptive", unit }, FRAME));
      assert.ok(cv(smooth) < 0.8 * cv(off), `${name} ${unit}: word-gap CV ${cv(smooth).toFixed(2)} vs ${cv(off).toFixed(2)} off`);
      if (unit === "word") {
        // the stall before a late word is the model's; smoothing must not make it longer
        const [a, b] = [Math.max(...smooth), Math.max(...off)];
        assert.ok(a <= b + 1e-6, `${name}: longest stall ${a} vs ${b} off`);
      }
    }
  }
});

test("a fixed pace (smoothStream's 10 ms per word) falls behind a fast model; adaptive keeps up", () => {
  const fast = Array.from({ length: 400 }, (_, i) => [100 + 2.5 * i, " word", i + 1]); // 400 words/s
  const fixed = new Smoother({ mode: "pace", unit: "word", paceTps: 100 }); // one word per 10 ms
  const adaptive = new Smoother({ mode: "adaptive", unit: "word" });
  for (let f = 0, i = 0; f < 1200; f += FRAME) {
    for (; i < fast.length && fast[i][0] <= f; i++) for (const s of [fixed, adaptive]) s.push(fast[i][1], fast[i][0], fast[i][2]);
    if (i === fast.length) { fixed.end(); adaptive.end(); }
    fixed.take(f);
    adaptive.take(f);
  }
  // 0.1 s after the last word arrived, adaptive has shown it all; the fixed pace is ~half a second behind
  assert.equal(adaptive.pending, 0);
  assert.ok(fixed.pending > 5 * 100, `fixed pace holds back only ${fixed.pending} chars`);
});

test("adaptive drains at the arrival rate: it keeps up after a speed-up, with a small buffer", () => {
  for (const name of ["speedup", "slowdown", "bursty"]) {
    const trace = TRACES[name];
    const s = new Smoother({ mode: "adaptive", unit: "char", maxHoldMs: 150 });
    let i = 0, maxLagMs = 0;
    for (let f = 0; !(i === trace.length && s.idle); f += FRAME) {
      while (i < trace.length && trace[i][0] <= f) { s.push(trace[i][1], trace[i][0]); i++; }
      s.take(f);
      // the buffer never holds more than what arrived in the last maxHoldMs
      const recent = trace.filter(([t]) => t > f - 150 && t <= f).reduce((n, [, x]) => n + x.length, 0);
      assert.ok(s.pending <= recent, `${name}: ${s.pending} chars buffered at ${f.toFixed(0)} ms, ${recent} arrived recently`);
      maxLagMs = Math.max(maxLagMs, s.horizonMs);
    }
    assert.ok(maxLagMs <= 150);
  }
  // steady arrivals: the horizon settles at about one gap, and every frame between arrivals paints
  const s = new Smoother({ mode: "adaptive", unit: "char" });
  steady(50, 40).forEach(([t, x]) => s.push(x, t));
  assert.ok(Math.abs(s.horizonMs - 50) < 10, `horizon ${s.horizonMs}`);
});

test("pace releases at the configured reading pace, in the reply's own characters per token", () => {
  // 100 tokens/s arrive; the reader's pace is 8 tokens/s; tokens are 6 characters (" model" etc. vary: use fixed)
  const trace = Array.from({ length: 300 }, (_, i) => [100 + 10 * i, " abcde", i + 1]);
  for (const unit of ["char", "word"]) {
    const rel = simulate(trace, { mode: "pace", unit, paceTps: 8 }, FRAME);
    const inWindow = rel.filter(([t]) => t >= 2000 && t < 12000).reduce((n, [, x]) => n + x.length, 0);
    const perSecond = inWindow / 10;
    assert.ok(Math.abs(perSecond - 8 * 6) / (8 * 6) < 0.05, `${unit}: ${perSecond} chars/s, want 48`);
  }
  // a pace faster than the arrivals cannot run ahead of them: it follows the text as it comes
  const slow = steady(200, 20);
  const rel = simulate(slow, { mode: "pace", unit: "char", paceTps: 50 }, FRAME);
  assert.equal(joined(rel), joined(slow));
});

test("word units release whole words, unless a word stays unfinished past its deadline", () => {
  for (const mode of ["adaptive", "pace"]) {
    for (const trace of [TRACES.bursty, TRACES.bursty2, TRACES.steady]) {
      const rel = simulate(trace, { mode, unit: "word", paceTps: 40, maxHoldMs: 150 }, FRAME);
      const full = joined(trace);
      const { arrived } = perChar(trace, rel);
      let at = 0, splits = 0;
      rel.forEach(([t, text], k) => {
        at += text.length;
        // the first text goes as it comes (it is the TTFT); the last ends the stream
        if (k === 0 || k === rel.length - 1 || (/\s/.test(full[at - 1]) && /\S/.test(full[at]))) return;
        // a split word: only adaptive's deadline may do that, when its last part has waited maxHoldMs
        splits += 1;
        assert.equal(mode, "adaptive", `${mode}: release ${k} ends inside a word: ${JSON.stringify(text)}`);
        assert.ok(t - arrived[at - 1] >= 150 - FRAME, `release ${k} split a word ${t - arrived[at - 1]} ms after it came`);
      });
      assert.ok(splits <= rel.length / 20, `${mode}: ${splits} of ${rel.length} releases split a word`);
    }
  }
  // a word still being written when the stream pauses is released at its deadline, not held forever
  const opts = { mode: "adaptive", unit: "word", maxHoldMs: 150 };
  const rel = simulate([[0, "Hi"], [10, " hello wor"], [2000, "ld"]], opts, FRAME);
  assert.deepEqual(rel.map((r) => r[1]), ["Hi", " hello ", "wor", "ld"]);
  assert.ok(rel[2][0] <= 10 + 150 + FRAME, JSON.stringify(rel));
  // ... and one that was finished in the meantime goes out whole
  const whole = simulate([[0, "Hi"], [10, " hello wor"], [100, "ld and"], [2000, " more"]], opts, FRAME);
  assert.deepEqual(whole.map((r) => r[1]), ["Hi", " hello ", "world ", "and", " more"]);
  // whitespace before a word goes with that word
  assert.deepEqual(simulate([[0, " one"], [50, " two"], [100, " three"]], opts, FRAME).map((r) => r[1]),
    [" one", " two ", "three"]);
});

test("the first text is shown as it comes: smoothing never delays the first token", () => {
  const trace = RECORDED[0].chunks; // "The", " Com", "it", "tee will meet", ...
  for (const mode of ["adaptive", "pace"]) {
    for (const unit of ["word", "char"]) {
      const rel = simulate(trace, { mode, unit }, FRAME);
      assert.equal(rel[0][1], "The");
      assert.ok(rel[0][0] - trace[0][0] < FRAME, `${mode}/${unit}: first release at ${rel[0][0]}, arrived ${trace[0][0]}`);
    }
  }
});

test("bad options are refused", () => {
  assert.throws(() => new Smoother({ mode: "fast" }), /mode/);
  assert.throws(() => new Smoother({ unit: "line" }), /unit/);
  assert.throws(() => new Smoother({ paceTps: 0 }), /paceTps/);
});
