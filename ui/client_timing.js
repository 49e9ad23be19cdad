// Latency Lab browser timing: the browser's own timestamps for each reply, and the clock offset.
//
// All times are performance.now() (the browser clock). A Recorder keeps, per chunk, when it
// arrived and when its text was painted (the next animation frame after the DOM change),
// both as ms since the user pressed send. The server joins them to the reply's Timeline
// (timeline.client) and derives client_ttft_ms, client_e2e_ms and transport_overhead_ms.
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
      this.paint = []; // ms since send, per chunk with text (null for a chunk without text)
      this.pending = [];
      this.frame = null;
      this.framesDone = null;
    }

    // A chunk was received (t: performance.now() when the read resolved). If it carries text,
    // the caller has just changed the DOM; its paint is the next animation frame.
    arrived(tokens, hasText, t) {
      const i = this.arrival.length;
      this.arrival.push((t == null ? performance.now() : t) - this.sendAt);
      this.arrivalTokens.push(tokens);
      this.paint.push(null);
      if (hasText) {
        this.pending.push(i);
        if (this.frame == null) this.frame = requestAnimationFrame(() => this._painted());
      }
      return i;
    }

    _painted() {
      const t = performance.now() - this.sendAt;
      for (const i of this.pending) this.paint[i] = t;
      this.pending = [];
      this.frame = null;
      if (this.framesDone) { const done = this.framesDone; this.framesDone = null; done(); }
    }

    // Resolves once every chunk with text has its paint time.
    settled() {
      if (this.frame == null) return Promise.resolve();
      return new Promise((resolve) => { this.framesDone = resolve; });
    }

    get firstPaint() { return this.paint.find((t) => t != null) ?? null; }

    toClient(transport) {
      return {
        send_at_ms: this.sendAt,
        arrival_ms: this.arrival,
        arrival_tokens: this.arrivalTokens,
        paint_ms: this.paint,
        clock_offset_ms: Clock.offset,
        clock_rtt_ms: Clock.rtt,
        transport: transport || "sse",
      };
    }
  }

  root.LabTiming = { Clock, Recorder };
})(window);
