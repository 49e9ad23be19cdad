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
// keeping the one with the smallest round trip; its error is at most half that round trip.
(function (root) {
  "use strict";

  const Clock = {
    offset: null, // server perf_counter ms − browser performance.now() ms
    rtt: null, // round trip of the ping the offset came from
    samples: [],
    async sync(pings) {
      for (let i = 0; i < (pings || 5); i++) {
        const t0 = performance.now();
        const r = await fetch("/lab/clock", { cache: "no-store" });
        const body = await r.json();
        const t1 = performance.now();
        Clock.samples.push({ rtt: t1 - t0, offset: body.server_ms - (t0 + t1) / 2, at: t1 });
      }
      // Only recent samples: the two clocks drift apart slowly (ppm), so an old best ping ages.
      const now = performance.now();
      Clock.samples = Clock.samples.filter((s) => now - s.at < 120000).slice(-20);
      const best = Clock.samples.reduce((a, b) => (b.rtt < a.rtt ? b : a));
      Clock.offset = best.offset;
      Clock.rtt = best.rtt;
      return best;
    },
    get bound() { return Clock.rtt == null ? null : Clock.rtt / 2; },
  };

  class Recorder {
    constructor(sendAt) {
      this.sendAt = sendAt; // performance.now() when the user pressed send
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
        clock_offset_ms: Clock.offset,
        clock_rtt_ms: Clock.rtt,
        transport: transport || "sse",
      }, extra || {});
    }
  }

  root.LabTiming = { Clock, Recorder };
})(window);
