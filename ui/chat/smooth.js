// Latency Lab smooth streaming: when arrived text goes on the page.
//
// Tokens arrive in bursts (a speculative step yields several, the network coalesces, a slow
// step leaves a gap); painting each burst as it lands makes the text jump and stall. A Smoother
// buffers the arrived text and releases it at a steadier pace. It is pure — no DOM, no clock —
// so its schedule is tested engine-free in Node on synthetic bursty traces
// (tests/js/smooth.test.js): the page pushes each chunk with its arrival time and, once per
// animation frame, takes the text due at that frame's time.
//
// Modes
//   off       everything at once, as it arrives.
//   adaptive  a jitter buffer whose drain rate follows the arrivals: after each arrival the
//             buffered text is spread evenly up to when the next arrival is expected (the mean gap
//             between arrivals plus twice its mean deviation, as TCP estimates a round trip), so a
//             burst plays out over the gap that follows it, and the buffer holds about one gap's
//             worth of text. No text waits more than `maxHoldMs` after it arrived: that bounds the
//             buffer, and how long text is held back after the last token arrived. A burst that
//             ends a silence longer than the horizon shows its first word at once: the reader is
//             already waiting, and holding it back would only lengthen the stall.
//   pace      a steady reading pace (`paceTps` tokens/s, in characters through the reply's own
//             characters per token) however fast text arrives. It can hold text back for long.
// Units (off ignores them)
//   char      any number of characters per release.
//   word      whole words only (a word and the whitespace after it, as the Vercel AI SDK's
//             smoothStream chunks); a word still being written waits for its end, the end of the
//             stream, or its maxHoldMs deadline (adaptive), whichever comes first. The first text
//             of a reply is shown as it comes, whole word or not: it is the time to first token.
// Why not a fixed delay per word (smoothStream's 10 ms) or a fixed 60 fps queue: a fixed rate is
// either slower than the model (the buffer grows without bound) or faster (it empties and the text
// stalls between bursts, as without smoothing). Following the measured arrivals avoids both.

export const MODES = ["off", "adaptive", "pace"];
export const UNITS = ["word", "char"];
export const DEFAULTS = { mode: "adaptive", unit: "word", maxHoldMs: 150, paceTps: 5.3, charsPerToken: 4 };
const SAME_BURST_MS = 1; // arrivals this close together are one burst (one network read)

export class Smoother {
  constructor(opts) {
    const o = Object.assign({}, DEFAULTS, opts || {});
    if (!MODES.includes(o.mode)) throw new Error(`smoothing mode must be one of ${MODES.join(", ")}`);
    if (!UNITS.includes(o.unit)) throw new Error(`smoothing unit must be one of ${UNITS.join(", ")}`);
    if (!(o.maxHoldMs >= 0)) throw new Error("maxHoldMs must be >= 0");
    if (!(o.paceTps > 0)) throw new Error("paceTps must be > 0");
    this.opts = o;
    this.text = "";          // everything that arrived
    this.released = 0;       // characters of `text` released so far
    this.tokens = 0;         // tokens behind `text` (for pace: characters per token)
    this.arrivals = [];      // [{t, end}]: text[prev.end, end) arrived at t
    this.due = 0;            // arrivals[due..] still have text waiting
    this.lastArrival = null;
    this.gapMean = null;     // smoothed gap between arrivals (ms)
    this.gapDev = 0;         // smoothed mean deviation of that gap (ms)
    this.drainFrom = null;   // the drain counts time from here: the last take, or the arrival that
                             // ended an empty spell (no credit builds up while nothing waits)
    this.credit = 0;         // units (characters or words) the drain owes, not yet released
    this.ended = false;
    this.words = 0;          // words begun in `text` (for the average word's length)
    this.urgent = false;     // the last arrival ended a silence longer than the horizon
  }

  get pending() { return this.text.length - this.released; }
  get idle() { return this.pending === 0; }

  // When the next arrival is expected to have come, after the last one (0 until a gap is known).
  get horizonMs() {
    if (this.gapMean == null) return 0;
    return Math.min(this.opts.maxHoldMs, this.gapMean + 2 * this.gapDev);
  }

  // Text arrived at time t (ms). `tokens`: how many tokens the reply has now (optional).
  push(text, t, tokens) {
    if (tokens != null) this.tokens = tokens;
    if (!text) return;
    if (this.pending === 0) { this.drainFrom = t; this.credit = 0; }
    const last = this.arrivals[this.arrivals.length - 1];
    if (last && t - last.t < SAME_BURST_MS) {
      last.end += text.length;
    } else {
      if (this.lastArrival != null) {
        this.urgent = this.opts.mode === "adaptive" && t - this.lastArrival > this.horizonMs;
        this._gap(t - this.lastArrival);
      }
      this.arrivals.push({ t, end: this.text.length + text.length });
      this.lastArrival = t;
    }
    for (let i = 0; i < text.length; i++) {
      const before = i ? text[i - 1] : this.text[this.text.length - 1];
      if (!/\s/.test(text[i]) && (before === undefined || /\s/.test(before))) this.words++;
    }
    this.text += text;
  }

  _gap(gap) { // RFC 6298's estimator: mean with gain 1/8, mean deviation with gain 1/4
    if (this.gapMean == null) {
      this.gapMean = gap;
      this.gapDev = gap / 2;
    } else {
      this.gapDev += (Math.abs(gap - this.gapMean) - this.gapDev) / 4;
      this.gapMean += (gap - this.gapMean) / 8;
    }
  }

  // No more text will come: a word still open is complete.
  end() { this.ended = true; }

  // Everything still held, at once (the reader asked to stop waiting).
  flush() { return this._release(this.text.length); }

  // The text to put on the page at time t (ms): "" when nothing is due. Called once per frame,
  // and at least while text is pending.
  take(t) {
    const o = this.opts;
    const prev = this.drainFrom == null ? t : Math.min(this.drainFrom, t);
    this.drainFrom = t;
    if (this.pending === 0) return "";
    if (o.mode === "off") return this._release(this.text.length);
    // The first text is the time to first token: it never waits, whole word or not.
    if (this.released === 0) return this._release(this.text.length);
    const ready = this._lastUnitEnd(); // units (characters, or finished words) that can go now
    let forced = this.released; // what deadlines force out, word finished or not
    let rate; // units per ms
    if (o.mode === "pace") {
      const cpt = this.tokens > 0 ? this.text.length / this.tokens : o.charsPerToken;
      rate = (o.paceTps * cpt) / 1000 / this._unitChars();
    } else {
      while (this.due < this.arrivals.length && this.arrivals[this.due].t + o.maxHoldMs <= t) {
        forced = Math.max(forced, this.arrivals[this.due].end);
        this.due++;
      }
      if (forced > this.released && o.unit === "word") forced = this._nextWordEnd(forced);
      // spread what is ready evenly up to the target, when the buffer should be empty
      const target = this.lastArrival + this.horizonMs;
      if (t >= target) return this._release(Math.max(ready, forced));
      rate = this._units(ready) / (target - prev);
    }
    this.credit = Math.min(this.credit + (t - prev) * rate, this._units(ready));
    let n = Math.round(this.credit); // the remainder carries over, so the long-run rate is exact
    // Spreading text fills the gaps between bursts; a burst that ends a silence longer than the
    // horizon finds the reader already waiting: its first word goes at once (not a longer stall).
    if (this.urgent && this._units(ready) >= 1) {
      n = Math.max(n, 1);
      this.urgent = false;
    }
    this.credit -= n;
    return this._release(Math.max(this._advance(n), forced));
  }

  _release(upTo) {
    upTo = Math.min(upTo, this.text.length);
    if (upTo <= this.released) return "";
    const out = this.text.slice(this.released, upTo);
    this.released = upTo;
    while (this.due < this.arrivals.length && this.arrivals[this.due].end <= this.released) this.due++;
    if (this.pending === 0) this.credit = 0;
    return out;
  }

  _unitChars() { return this.opts.unit === "word" ? this.text.length / Math.max(1, this.words) : 1; }

  // The end of the last unit that can be released now.
  _lastUnitEnd() {
    if (this.opts.unit === "char" || this.ended) return this.text.length;
    return this._wordEnd(this.text.length);
  }

  // Units between `released` and `upTo`.
  _units(upTo) {
    if (this.opts.unit === "char") return upTo - this.released;
    let n = 0;
    for (let i = this.released + 1; i <= upTo; i++) if (this._isWordEnd(i)) n++;
    return n;
  }

  // The position `n` units after `released` (no further than the last releasable unit).
  _advance(n) {
    if (n <= 0) return this.released;
    if (this.opts.unit === "char") return Math.min(this.released + n, this.text.length);
    const last = this._lastUnitEnd();
    for (let i = this.released + 1; i <= last; i++) if (this._isWordEnd(i) && --n === 0) return i;
    return last;
  }

  // A word ends at i when the whitespace after it is over (the next word has begun), or the stream
  // is; whitespace before the first word still to release belongs to that word.
  _isWordEnd(i) {
    const s = this.text;
    if (i === s.length) return this.ended;
    return i > this._firstWordChar() && /\s/.test(s[i - 1]) && !/\s/.test(s[i]);
  }

  _firstWordChar() {
    if (this._fwc == null || this._fwc.from !== this.released || this._fwc.at === this._fwc.len) {
      let at = this.released;
      while (at < this.text.length && /\s/.test(this.text[at])) at++;
      this._fwc = { from: this.released, at, len: this.text.length };
    }
    return this._fwc.at;
  }

  // The last word end at or before `limit`; `released` when there is none.
  _wordEnd(limit) {
    for (let i = Math.min(limit, this.text.length); i > this.released; i--) if (this._isWordEnd(i)) return i;
    return this.released;
  }

  // The first word end at or after `from`; `from` itself when that word is still being written.
  _nextWordEnd(from) {
    for (let i = from; i <= this.text.length; i++) if (this._isWordEnd(i)) return i;
    return from;
  }
}

// Replay a trace of arrivals through a Smoother with a frame every `frameMs` (first at
// `firstFrameMs`): what the page does, without a page. trace: [[t, text, tokens?], ...];
// endAt: when the stream ends (default: the last arrival). Returns [[t, text], ...] releases.
export function simulate(trace, opts, frameMs, firstFrameMs, endAt) {
  const s = new Smoother(opts);
  const step = frameMs || 1000 / 60;
  const end = endAt != null ? endAt : (trace.length ? trace[trace.length - 1][0] : 0);
  const out = [];
  let i = 0;
  for (let f = firstFrameMs || 0; ; f += step) {
    while (i < trace.length && trace[i][0] <= f) { s.push(trace[i][1], trace[i][0], trace[i][2]); i++; }
    if (i === trace.length && end <= f) s.end();
    const text = s.take(f);
    if (text) out.push([f, text]);
    if (s.ended && s.idle) return out;
    if (f > end + 3600e3) throw new Error("the smoother did not drain within an hour of the end");
  }
}
