"""A reply that opens with a thought: where the thought starts and ends, and where the answer begins.

One place for every engine. Models that think first write a `<think> … </think>` block before
the answer (Qwen3, DeepSeek-R1, QwQ; llama.cpp without a reasoning format streams it so). Servers
with a reasoning parser send the thought apart instead: vLLM's `reasoning` (`reasoning_content`
before 0.11, docs/features/reasoning_outputs.md in vllm-project/vllm), llama.cpp's
`reasoning_content` (`--reasoning-format deepseek`, tools/server/README.md) and Ollama's
`message.thinking` (docs/api.md in ollama/ollama). The remote client turns those deltas back into a
marked block (`ReasoningText`), so the thought stays in the reply's text, marked, never dropped,
and one scanner (`ThoughtScan`) reads every reply the same way:

- the *first thought token*: the chunk holding the first visible (non-space) character of the
  thought (the opening tag alone is not yet a thought, as a server with a reasoning parser never
  sends it);
- the *end of thinking*: the chunk that completes the closing tag;
- the *first answer token*: the chunk holding the first visible character after it (a reply with
  no thought: its first visible character, so `ttfa_ms` means the same for every reply).

Only a reply that *opens* with a thought (whitespace before the tag aside) has one; a `<think>`
later in an answer is answer text. `ThoughtClock` stamps the three instants on a Timeline
(RequestHandle.push feeds it every chunk of every engine: local, remote, the paced test source);
`thought_marks` gives the same points as character offsets of a finished text, and
`perceived_thinking` the browser's counterparts from the page's paint log.
"""

from __future__ import annotations

from bisect import bisect_right

OPEN, CLOSE = "<think>", "</think>"
# Character offsets into the reply's text; None where the reply has no such point.
MARKS = ("thought", "end", "answer")


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (a tag cut by a chunk)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThoughtScan:
    """Feed a reply's text piece by piece; each call returns the marks it completed, as
    (mark, character offset) in the whole text so far. Keeps only the text still undecided (a tag
    cut between two chunks), so a reply costs one pass."""

    def __init__(self) -> None:
        self.state = "start"  # start | thought | after | done
        self.pos = 0  # offset of self.buf in the whole text
        self.buf = ""  # text not yet classified
        self.seen_thought = False
        self.open_at: int | None = None  # where the thought's body begins (after the opening tag)

    def feed(self, piece: str) -> list[tuple[str, int]]:
        if self.state == "done" or not piece:
            return []
        self.buf += piece
        found: list[tuple[str, int]] = []
        while True:
            before = (self.state, self.pos, len(self.buf))
            getattr(self, f"_{self.state}")(found)
            if self.state == "done" or (self.state, self.pos, len(self.buf)) == before:
                return found

    def close(self) -> list[tuple[str, int]]:
        """The text ended: what was held back as a possible tag is text after all."""
        found: list[tuple[str, int]] = []
        body = self.buf.lstrip()
        if body and self.state in ("start", "after"):
            found.append(("answer", self.pos + len(self.buf) - len(body)))
        elif body and self.state == "thought" and not self.seen_thought:
            found.append(("thought", self.pos + len(self.buf) - len(body)))
        self.state, self.buf = "done", ""
        return found

    def _advance(self, n: int) -> None:
        self.pos += n
        self.buf = self.buf[n:]

    def _start(self, found) -> None:
        body = self.buf.lstrip()
        lead = len(self.buf) - len(body)
        if not body or (OPEN.startswith(body) and body != OPEN):
            return  # only whitespace, or maybe the opening tag: wait for more
        if body.startswith(OPEN):
            self._advance(lead + len(OPEN))
            self.state, self.open_at = "thought", self.pos
            return
        found.append(("answer", self.pos + lead))  # no thought: this is the answer's first character
        self.state, self.buf = "done", ""

    def _thought(self, found) -> None:
        i = self.buf.find(CLOSE)
        decided = self.buf[:i] if i >= 0 else self.buf[:len(self.buf) - _partial_suffix(self.buf, CLOSE)]
        if not self.seen_thought:
            visible = len(decided) - len(decided.lstrip())
            if visible < len(decided):
                found.append(("thought", self.pos + visible))
                self.seen_thought = True
        if i < 0:
            self._advance(len(decided))
            return
        found.append(("end", self.pos + i + len(CLOSE) - 1))  # the character that completed the tag
        self._advance(i + len(CLOSE))
        self.state = "after"

    def _after(self, found) -> None:
        body = self.buf.lstrip()
        if not body:
            self._advance(len(self.buf))
            return
        found.append(("answer", self.pos + len(self.buf) - len(body)))
        self.state, self.buf = "done", ""


def thought_marks(text: str) -> dict:
    """{"thought", "end", "answer"}: character offsets in a whole reply (None: no such point)."""
    scan, marks = ThoughtScan(), dict.fromkeys(MARKS)
    marks.update(scan.feed(text))
    marks.update(scan.close())
    return marks


class ThoughtClock:
    """Stamps a Timeline's thought instants as a reply's chunks are produced: each chunk at the time
    its last token was sampled (Timeline.token_ns; the engine's own stamp, so the figures share TTFT's
    reference), or now for a chunk that carries no new token (text held back, then flushed)."""

    def __init__(self, timeline) -> None:
        self.tl = timeline
        self.scan = ThoughtScan()
        self.ends: list[int] = []  # end offset of each chunk's text (exclusive)
        self.at: list[tuple[int, int]] = []  # (sampling instant, output tokens so far) of each chunk
        self.length = 0
        self.offsets: dict = {}  # character offsets found so far: open, thought, end, answer (the page's fold)

    def known(self) -> dict:
        """The offsets found so far (the page folds the thought away by them; see ThoughtScan's marks)."""
        if self.scan.open_at is not None:
            self.offsets.setdefault("open", self.scan.open_at)
        out = dict(self.offsets)
        if out.get("end") is not None:
            out["close"] = out["end"] - len(CLOSE) + 1  # where the closing tag begins
        return out

    def chunk(self, text: str, output_tokens: int, now_ns: int) -> None:
        if not text or self.scan.state == "done":
            return
        tokens = self.tl.token_ns
        t = tokens[output_tokens - 1] if 0 < output_tokens <= len(tokens) else now_ns
        self.length += len(text)
        self.ends.append(self.length)
        self.at.append((t, output_tokens))
        self._stamp(self.scan.feed(text))

    def finish(self, output_tokens: int) -> None:
        """The reply ended: text held back as a possible tag is placed; a thought still open took
        every token (and never ended)."""
        if self.scan.state == "thought":
            self.tl.thought_tokens = output_tokens
        self._stamp(self.scan.close())

    def _stamp(self, marks: list[tuple[str, int]]) -> None:
        for mark, offset in marks:
            self.offsets[mark] = offset
            t_mark, tokens_so_far = self.at[bisect_right(self.ends, offset)]
            if mark == "answer":
                self.tl.answer_first_ns = t_mark
                continue
            if self.tl.counters.thought_source is None:  # unless a server's field said otherwise
                self.tl.counters.thought_source = "text"
            if mark == "thought":
                self.tl.thought_first_ns = t_mark
            else:
                self.tl.thought_end_ns, self.tl.thought_tokens = t_mark, tokens_so_far
        if self.scan.state == "done":
            self.ends, self.at = [], []  # nothing left to place


class ReasoningText:
    """A server's separate reasoning and content deltas → one marked text: the reasoning inside
    `<think>` … `</think>`, as a model that thinks in its text writes it."""

    def __init__(self) -> None:
        self.inside = False

    def piece(self, reasoning: str, content: str) -> str:
        out = ""
        if reasoning:
            if not self.inside:
                out, self.inside = OPEN, True
            out += reasoning
        if content and self.inside:
            out, self.inside = out + CLOSE, False
        return out + content


def perceived_thinking(text: str, shown_chars: list, shown_paint_ms: list) -> dict:
    """The browser's counterparts (ms since the user pressed send, the browser's clock): when the
    first thought character, the closing tag and the first answer character were first painted.
    `shown_chars[i]`: the visible reply's length after update i, `shown_paint_ms[i]`: the frame that
    painted it (None: not painted), as ui/chat/perceived.py receives them. Unknown points are None."""
    marks = thought_marks(text)

    def painted(offset):
        if offset is None:
            return None
        for chars, t in zip(shown_chars, shown_paint_ms):
            if chars > offset and t is not None:
                return t
        return None

    thought, end, answer = (painted(marks[m]) for m in MARKS)
    return {"client_ttft_thought_ms": thought,
            "client_thinking_ms": end - thought if thought is not None and end is not None else None,
            "client_ttfa_ms": answer}
