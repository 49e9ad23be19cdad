"""This browser's paint limit: the stress run's reply, its rates and its target, declared once.

The stress run (the Chat tab's "Stress run" button, ui/chat/stress.js; `python -m ui.bench stress`)
streams one long markdown reply from the paced test source at rising rates, whatever backend the app
serves, and measures what the page does with it: paint lag, long tasks, render cost per chunk
(markdown vs DOM), dropped frames. The reply (~4,000 tokens) holds what makes a renderer work:
headings, paragraphs with inline marks, bulleted and numbered lists, fenced code blocks and tables.
"""

from __future__ import annotations

import threading

from engine.core.errors import InvalidRequest

from .paced import PacedSource

RATES = (25, 100, 400, 1600)  # tok/s, rising
TARGET_P99_MS = 50.0  # the page keeps up at a rate while paint lag p99 stays within this (issue 42)
REPLY_TOKENS = 4000
MAX_SECONDS = 20.0  # a slow rate streams only the reply's first rate × this many tokens (25 tok/s: 500)
MIN_TPS, MAX_TPS = 1.0, 20000.0


def _section(k: int) -> list[str]:
    """One section of the reply, as the paced source's tokens (a word with its leading space, or a mark)."""
    words = lambda s: [w if i == 0 else " " + w for i, w in enumerate(s.split(" "))]  # noqa: E731
    out = ["## ", f"Part {k}", "\n\n"]
    out += words(f"This part measures **stage {k}** of the reply: the *renderer* keeps the `tail` block "
                 "open while it streams and freezes a block once a blank line ends it.") + ["\n\n"]
    for i in range(1, 5):
        out += ["- "] + words(f"item {i} of part {k} with **bold** and `code` marks") + ["\n"]
    out += ["\n"]
    for i in range(1, 4):
        out += [f"{i}. "] + words(f"step {i}: read the *figures* then compare them") + ["\n"]
    out += ["\n", "```py", "\n"]
    for i in range(8):
        out += ["for", " x", " in", f" range({k + i}):", "\n", "    total", " +=", " x", " *", f" {i}", "\n"]
    out += ["```", "\n\n"]
    out += ["| rate", " | p50", " | p99", " |", "\n", "|---|---|---|", "\n"]
    for i in range(5):
        out += ["| ", f"{25 * 4 ** (i % 4)}", " | ", f"{k + i}.{i}", " ms", " | ", f"{3 * (k + i)}", " ms", " |", "\n"]
    out += ["\n"]
    return out


def long_reply(tokens: int = REPLY_TOKENS) -> tuple[str, ...]:
    """The stress run's reply: sections until it holds `tokens` tokens."""
    out: list[str] = []
    k = 1
    while len(out) < tokens:
        out += _section(k)
        k += 1
    return tuple(out[:tokens])


def tokens_at(tps: float) -> int:
    """How many of the reply's tokens a rate streams (all of them, or MAX_SECONDS' worth)."""
    return max(1, min(REPLY_TOKENS, int(tps * MAX_SECONDS)))


class StressSources:
    """One paced source per rate asked for, made on first use, all streaming the same long reply."""

    def __init__(self) -> None:
        self._sources: dict[float, PacedSource] = {}
        self._lock = threading.Lock()
        self._reply = long_reply()

    def source(self, tps) -> PacedSource:
        if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not MIN_TPS <= tps <= MAX_TPS:
            raise InvalidRequest(f"a stress run's rate must be a number of tok/s from {MIN_TPS:g} to {MAX_TPS:g}",
                                 "stress_tps")
        with self._lock:
            if tps not in self._sources:
                self._sources[tps] = PacedSource(float(tps), words=self._reply)
            return self._sources[tps]

    def close(self) -> None:
        for s in self._sources.values():
            s.close()
