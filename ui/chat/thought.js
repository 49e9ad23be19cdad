// A reply that opens with a thought: its thought folded away under a live "thinking… N tokens" while it
// streams ("thought · N tokens" once it ended, "thought for 1.2 s" once its timings are joined), the
// answer below as usual. The server finds where the thought begins and ends (engine/core/thinking.py,
// one scanner for every engine) and sends those offsets of the reply's text with each chunk
// (`marks`: open, thought, close, end, answer), so the page never looks for tags itself.
import { fmtInt, fmtMs } from "../shell/format.js";

// A piece of reply text that starts at character `at`, split by the marks known so far into the part
// that goes in the fold and the part that goes to the answer (the tags themselves are not shown). Pure.
// Without an opening thought (no `open` mark) everything is answer.
export function splitPiece(at, piece, marks) {
  const m = marks || {};
  if (m.open == null) return { thought: "", answer: piece };
  const close = m.close != null ? m.close : Infinity; // not closed yet: all of it is thought
  const after = m.end != null ? m.end + 1 : Infinity;
  const cut = (lo, hi) => piece.slice(Math.max(0, Math.min(piece.length, lo - at)), Math.max(0, Math.min(piece.length, hi - at)));
  return { thought: cut(m.open, close), answer: cut(after, Infinity) };
}

export class ThoughtFold {
  constructor(bubble) {
    this.bubble = bubble; // the reply's .lab-bubble: the fold goes before its text
    this.marks = {};
    this.tokens = 0; // output tokens so far while the thought streams
    this.el = null;
  }

  // A chunk arrived: the marks the server has found so far, and the reply's output tokens.
  update(marks, tokens) {
    if (marks) this.marks = marks;
    if (this.marks.end == null && tokens != null) this.tokens = tokens;
    if (this.el) this._summary();
  }

  // Show a piece of text starting at character `at`; returns the part that belongs to the answer.
  show(at, piece) {
    const { thought, answer } = splitPiece(at, piece, this.marks);
    if (thought) {
      this._make();
      this.text.appendData(thought);
    }
    if (this.el && this.marks.end != null && at + piece.length > this.marks.end) this._summary();
    return answer;
  }

  // The reply's timings came back: how long the browser showed it thinking.
  joined(client, timeline) {
    if (!this.el) return;
    this.thinkingMs = client && client.client_thinking_ms != null ? client.client_thinking_ms : null;
    if (timeline && timeline.thought_tokens != null) this.tokens = timeline.thought_tokens;
    this._summary();
  }

  _make() {
    if (this.el) return;
    const d = document.createElement("details");
    d.className = "lab-thought";
    d.innerHTML = `<summary></summary><div class="lab-thought-text"></div>`;
    this.text = d.querySelector(".lab-thought-text").appendChild(document.createTextNode(""));
    this.el = d;
    this.bubble.insertBefore(d, this.bubble.firstChild);
    this._summary();
  }

  _summary() {
    const s = this.el.querySelector("summary");
    const ended = this.marks.end != null;
    const n = `${fmtInt(this.tokens)} token${this.tokens === 1 ? "" : "s"}`;
    s.textContent = !ended ? `thinking… ${n}`
      : this.thinkingMs != null ? `thought for ${fmtMs(this.thinkingMs)} · ${n}` : `thought · ${n}`;
    this.el.classList.toggle("lab-thinking", !ended);
  }
}
