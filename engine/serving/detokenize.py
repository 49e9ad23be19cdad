"""Token ids → text, as the tokens arrive, and stop strings.

`IncrementalDetokenizer` never shows half a character: it feeds tokenizers' own
`tokenizers.decoders.DecodeStream`, which holds back the bytes of a character split across tokens
until its last byte arrives and keeps the tokenizer's context for spacing. It replaced our own
offsets scheme (re-decoding a window of ids with `tokenizer.decode` at every token, as
text-generation-inference and vLLM did), which met the same contract (tests/test_detokenize.py)
at several times the cost per token. Only the end of a reply that stopped mid-character, which
DecodeStream keeps to itself, is decoded here.

`StopStrings` holds back any tail of the text that could be the start of a stop string, so a
stop string is never shown, even when it arrives spread over several tokens.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer  # the Rust tokenizer under every AutoTokenizer (transformers 5)
        self._stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self._context = 0  # where the ids of the last text returned begin (spacing context for flush)
        self._shown = 0  # text of ids[:_shown] has been returned

    def add(self, new_ids: list[int]) -> str:
        """Append token ids; return the text that is now complete (maybe empty)."""
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        text = self._stream.step(self._backend, list(new_ids))
        if text is None:  # the middle of a character, or a special token
            return ""
        self._context, self._shown = self._shown, len(self.ids)
        return text

    def flush(self) -> str:
        """At the end: whatever is left, even an incomplete character (shown as U+FFFD)."""
        if self._shown == len(self.ids):
            return ""
        before = self._decode(self.ids[self._context : self._shown])
        after = self._decode(self.ids[self._context :])
        self._context = self._shown = len(self.ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


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
