"""Token ids → text, as the tokens arrive, and stop strings.

`IncrementalDetokenizer` never shows half a character: a multi-byte character split across
tokens decodes to U+FFFD until its last byte arrives, so text is held back while the decoded
tail ends in U+FFFD (the offsets scheme of text-generation-inference and vLLM).

`StopStrings` holds back any tail of the text that could be the start of a stop string, so a
stop string is never shown, even when it arrives spread over several tokens.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # decode from here, so the tokenizer sees context for spacing
        self.read_offset = 0  # text of ids[:read_offset] has already been returned

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, new_ids: list[int]) -> str:
        """Append token ids; return the text that is now complete (maybe empty)."""
        self.ids.extend(new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """At the end: whatever is left, even an incomplete character (shown as U+FFFD)."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


class StopStrings:
    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""  # text held back: it might be the start of a stop string

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; return (text safe to show, whether a stop string was reached)."""
        buf = self.pending + text
        if not self.stops:
            self.pending = ""
            return buf, False
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)], True
        hold = self._partial_match(buf)
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out

    def _partial_match(self, buf: str) -> int:
        """Length of the longest tail of buf that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
