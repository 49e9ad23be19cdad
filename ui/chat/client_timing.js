// Latency Lab browser timing: the browser's own timestamps for each reply, and the clock offset.
//
// All times are performance.now() (the browser clock). A Recorder keeps, per chunk, when it
// arrived and when all its text was painted (the next animation frame after the DOM change);
// each time reply text was put on the page (at once, or later when smoothing holds it) and its
// paint; and when the first feedback and the server's first status were painted — all as ms
// since the user pressed send. The server joins them to the reply's Timeline (timeline.client)
// and derives client_ttft_ms, client_e2e_ms, transport_overhead_ms and the perceived metrics
// (ui/chat/perceived.py).
//
// The clock offset (server ms − browser ms) is estimated NTP-style: a few pings to /lab/clock,
// keeping the one with the smallest round trip; its error is at most half that round trip. Any
// request whose answer carries the server's clock is a sample too (a turn's one request after its
// stream, ui/chat/run.js): `Clock.add`.

export const SAMPLE_MAX_AGE_MS = 120000; // the two clocks drift apart slowly (ppm), so an old best ping ages out
export const SAMPLES_KEPT = 20;

// The samples still worth keeping at `now` (recent ones, the last SAMPLES_KEPT) and the one with the
// shortest round trip among them: its offset is the estimate, half its round trip the bound. Pure.
export function bestSample(samples, now) {
  const kept = samples.filter((s) => now - s.at < SAMPLE_MAX_AGE_MS).slice(-SAMPLES_KEPT);
  const best = kept.length ? kept.reduce((a, b) => (b.rtt < a.rtt ? b : a)) : null;
  return { kept, best };
}

// One sample: sent at t0, answered at t1 (browser ms), the server's clock `serverMs` in between.
export const sample = (t0, serverMs, t1) => ({ rtt: t1 - t0, offset: serverMs - (t0 + t1) / 2, at: t1 });

export class Clock {
  constructor() {
    this.offset = null; // server perf_counter ms − browser performance.now() ms
    this.rtt = null; // round trip of the sample the offset came from
    this.samples = [];
    this.bestAt = null; // when that sample was taken (browser ms)
  }

  add(t0, serverMs, t1) {
    this.samples.push(sample(t0, serverMs, t1));
    return this.settle(t1);
  }

  settle(now) {
    const { kept, best } = bestSample(this.samples, now);
    this.samples = kept;
    if (best) {
      this.offset = best.offset;
      this.rtt = best.rtt;
      this.bestAt = best.at;
    }
    return best;
  }

  async sync(pings) {
    for (let i = 0; i < (pings || 5); i++) {
      const t0 = performance.now();
      const r = await fetch("/lab/clock", { cache: "no-store" });
      const body = await r.json();
      this.samples.push(sample(t0, body.server_ms, performance.now()));
    }
    return this.settle(performance.now());
  }

  get bound() { return this.rtt == null ? null : this.rtt / 2; }
}

// When the character at `offset` of the reply was first painted: the paint of the first update whose
// visible text reached past it (null: not painted, or no such character). Pure.
export function paintedAt(offset, shownChars, shownPaint) {
  if (offset == null) return null;
  for (let k = 0; k < shownChars.length; k++) {
    if (shownChars[k] > offset && shownPaint[k] != null) return shownPaint[k];
  }
  return null;
}

// The browser's counterparts of ttft_thought_ms, thinking_ms and ttfa_ms, live from the paint log and
// the thought's offsets the server sends with the chunks (the same definitions as
// engine/core/thinking.py perceived_thinking, which the server applies when the timings go up). Pure.
export function thoughtFigures(marks, shownChars, shownPaint) {
  const m = marks || {};
  const [thought, end, answer] = ["thought", "end", "answer"].map((k) => paintedAt(m[k], shownChars, shownPaint));
  return {
    client_ttft_thought_ms: thought,
    client_thinking_ms: thought != null && end != null ? end - thought : null,
    client_ttfa_ms: answer,
  };
}

export class Recorder {
  constructor(sendAt, clock) {
    this.sendAt = sendAt; // performance.now() when the user pressed send
    this.clock = clock; // the session's Clock: its offset goes up with the timings
    this.arrival = []; // ms since send, per chunk
    this.arrivalTokens = []; // output tokens so far at each chunk
    this.arrivalChars = []; // reply characters so far at each chunk
    this.paint = []; // ms since send, per chunk: when all its text was painted (null: no text)
    this.shownMs = []; // each time reply text was put on the page: ms since send
    this.shownChars = []; // ... the reply's visible length then
    this.shownPaint = []; // ... and the frame that painted it
    this.feedbackMs = null; // the user's message and a status painted
    this.statusMs = null; // the server's first status painted
    this.visible = 0;
    this.nextChunk = 0; // the first chunk not yet fully painted
    this.pending = []; // shown updates and stamps waiting for their frame
    this.frame = null;
    this.framesDone = null;
    this.marks = {}; // the reply's thought offsets as the server found them (ui/chat/thought.js)
  }

  // A chunk was received (t: performance.now() when the read resolved) carrying `chars` characters.
  // Without smoothing the caller shows its text at once (shown); with smoothing, later.
  arrived(tokens, chars, t) {
    const i = this.arrival.length;
    const before = i ? this.arrivalChars[i - 1] : 0;
    this.arrival.push((t == null ? performance.now() : t) - this.sendAt);
    this.arrivalTokens.push(tokens);
    this.arrivalChars.push(before + (chars || 0));
    this.paint.push(null);
    return i;
  }

  // The page just put reply text on screen: the reply is `chars` characters long now. Its paint is
  // the next animation frame; `inFrame`: the change was made in a frame callback, so this frame
  // paints it.
  shown(chars, t, inFrame) {
    const k = this.shownMs.length;
    const at = (t == null ? performance.now() : t) - this.sendAt;
    this.shownMs.push(at);
    this.shownChars.push(chars);
    this.shownPaint.push(null);
    if (inFrame) this._paintShown(k, at);
    else this._onFrame(() => this._paintShown(k, performance.now() - this.sendAt));
  }

  // Stamp when something (the first feedback, the first server status) is first painted.
  stamp(name) {
    if (this[name + "Ms"] != null || this["_" + name]) return;
    this["_" + name] = true;
    this._onFrame(() => { this[name + "Ms"] = performance.now() - this.sendAt; });
  }

  _paintShown(k, at) {
    this.shownPaint[k] = at;
    this.visible = Math.max(this.visible, this.shownChars[k]);
    const c = this.arrivalChars;
    for (; this.nextChunk < c.length && c[this.nextChunk] <= this.visible; this.nextChunk++) {
      const had = c[this.nextChunk] > (this.nextChunk ? c[this.nextChunk - 1] : 0);
      if (had) this.paint[this.nextChunk] = at;
    }
  }

  _onFrame(fn) {
    this.pending.push(fn);
    if (this.frame == null) this.frame = requestAnimationFrame(() => this._painted());
  }

  _painted() {
    const todo = this.pending;
    this.pending = [];
    this.frame = null;
    todo.forEach((fn) => fn());
    if (this.framesDone && this.frame == null) { const done = this.framesDone; this.framesDone = null; done(); }
  }

  // Resolves once everything shown so far has its paint time.
  settled() {
    if (this.frame == null) return Promise.resolve();
    return new Promise((resolve) => { this.framesDone = resolve; });
  }

  get firstPaint() { return this.paint.find((t) => t != null) ?? null; }

  toClient(transport, extra) {
    return Object.assign({
      send_at_ms: this.sendAt,
      arrival_ms: this.arrival,
      arrival_tokens: this.arrivalTokens,
      arrival_chars: this.arrivalChars,
      paint_ms: this.paint,
      shown_ms: this.shownMs,
      shown_chars: this.shownChars,
      shown_paint_ms: this.shownPaint,
      feedback_ms: this.feedbackMs,
      status_ms: this.statusMs,
      clock_offset_ms: this.clock ? this.clock.offset : null,
      clock_rtt_ms: this.clock ? this.clock.rtt : null,
      transport: transport || "sse",
      thought_marks: this.marks,
    }, thoughtFigures(this.marks, this.shownChars, this.shownPaint), extra || {});
  }
}
