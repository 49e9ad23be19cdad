// A reply's opening thought on the page (ui/chat/thought.js, ui/chat/client_timing.js) in Node: text is
// split into the fold and the answer by the server's offsets however it is chunked, and the browser's
// thought figures are the paint times of those offsets (the same as engine/core/thinking.py's
// perceived_thinking on the same data: 20, 30, 50 there too).
import assert from "node:assert/strict";
import test from "node:test";

import { paintedAt, thoughtFigures } from "../../ui/chat/client_timing.js";
import { splitPiece } from "../../ui/chat/thought.js";

const TEXT = "<think>\nHi there.</think>\n\nParis.";
const MARKS = { open: 7, thought: 8, close: 17, end: 24, answer: 27 }; // ThoughtClock.known() of TEXT

test("any chunking puts the thought in the fold and the rest in the answer, tags hidden", () => {
  for (let i = 0; i <= TEXT.length; i++) {
    for (let j = i; j <= TEXT.length; j++) {
      let thought = "", answer = "";
      for (const [at, piece] of [[0, TEXT.slice(0, i)], [i, TEXT.slice(i, j)], [j, TEXT.slice(j)]]) {
        const s = splitPiece(at, piece, MARKS);
        thought += s.thought;
        answer += s.answer;
      }
      assert.equal(thought, "\nHi there.");
      assert.equal(answer, "\n\nParis.");
    }
  }
});

test("a reply with no thought is all answer; a thought not yet closed is all thought", () => {
  assert.deepEqual(splitPiece(0, "Paris.", { answer: 0 }), { thought: "", answer: "Paris." });
  assert.deepEqual(splitPiece(7, "\nHi th", { open: 7, thought: 8 }), { thought: "\nHi th", answer: "" });
});

test("the browser's thought figures are when those characters were first painted", () => {
  const chars = [5, 12, 20, 26, 30, 33], paint = [10, 20, 30, null, 50, 60];
  assert.equal(paintedAt(8, chars, paint), 20);
  assert.equal(paintedAt(24, chars, paint), 50); // at 26 chars it was not painted; at 30 it was
  assert.deepEqual(thoughtFigures(MARKS, chars, paint),
    { client_ttft_thought_ms: 20, client_thinking_ms: 30, client_ttfa_ms: 50 });
  assert.deepEqual(thoughtFigures({ answer: 0 }, chars, paint),
    { client_ttft_thought_ms: null, client_thinking_ms: null, client_ttfa_ms: 10 });
});
