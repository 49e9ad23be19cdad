"""Perceived latency: what the reader of a reply experiences, from the browser's own timestamps.

Pure functions, no engine and no page. Every time is ms since the user pressed send (browser
clock). The page reports when each piece of reply text was put on the page (`shown_ms`), how
long the visible reply was then (`shown_chars`) and the frame that painted it (`shown_paint_ms`);
when each chunk arrived (`arrival_ms`) and the reply's length after it (`arrival_chars`); and when
its first feedback and the server's first status were painted. With smoothing off, text is shown
the moment it arrives; with smoothing on (ui/chat/smooth.js) it is shown later, more evenly.

Why gaps between *words* and not between paints: a reader reads words. A burst of nine tokens
painted at once after 130 ms of nothing is as even, paint to paint, as one token every 130 ms,
but it reads as a jump; counted per word it is eight gaps of 0 and one of 130 ms.
"""

from __future__ import annotations

import re
import statistics

_WORD = re.compile(r"\S+")
# The metrics this module adds to `timeline.client` (glossary names).
METRICS = ["client_feedback_ms", "client_status_ms", "client_first_word_ms", "paint_gap_cv", "paint_gap_max_ms",
           "reader_wait_ms", "smoothing_hold_ms"]
SMOOTHING_MODES = ("off", "adaptive", "pace")
SMOOTHING_UNITS = ("word", "char")


def word_ends(text: str) -> list[int]:
    """Where each word of `text` ends (the index after its last character)."""
    return [m.end() for m in _WORD.finditer(text)]


def word_paint_times(text: str, shown_chars: list[float], shown_paint_ms: list[float | None]) -> list[float]:
    """When each word became fully visible: the paint of the first update that showed its last character."""
    out, k = [], 0
    for end in word_ends(text):
        while k < len(shown_chars) and shown_chars[k] < end:
            k += 1
        if k == len(shown_chars) or shown_paint_ms[k] is None:
            break  # never shown (a stopped reply), or not painted yet
        out.append(shown_paint_ms[k])
    return out


def gap_stats(times: list[float]) -> tuple[float | None, float | None]:
    """(coefficient of variation, longest) of the gaps between successive times."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    if not gaps:
        return None, None
    mean = statistics.fmean(gaps)
    cv = statistics.pstdev(gaps) / mean if mean > 0 else None
    return cv, max(gaps)


def reader_wait_ms(paints: list[tuple[float, float]], chars_per_ms: float) -> float | None:
    """A reader starts at the first painted text and reads at `chars_per_ms`; when they catch up
    with what is painted, they wait. Returns their total wait (paints: (time, visible chars))."""
    if not paints or not chars_per_ms > 0:
        return None
    now, visible = paints[0]
    read = wait = 0.0
    for t, chars in paints[1:]:
        dt = t - now
        catch_up = (visible - read) / chars_per_ms  # time to read what is already painted
        if catch_up < dt:
            wait += dt - catch_up
            read = visible
        else:
            read += dt * chars_per_ms
        now, visible = t, max(visible, chars)
    return wait


def smoothing_hold_ms(arrival_ms: list[float], arrival_chars: list[float], shown_ms: list[float]) -> float | None:
    """From the last text's arrival to when the last text was put on the page (0 without smoothing)."""
    last_text = None
    previous = 0.0
    for t, chars in zip(arrival_ms, arrival_chars):
        if chars > previous:
            last_text, previous = t, chars
    if last_text is None or not shown_ms:
        return None
    return max(0.0, shown_ms[-1] - last_text)


def perceived(raw: dict, text: str, output_tokens: int, reading_pace_tps: float) -> dict:
    """The perceived metrics of one reply (glossary names), from the page's checked timestamps."""
    shown, chars, painted = raw["shown_ms"], raw["shown_chars"], raw["shown_paint_ms"]
    words = word_paint_times(text, chars, painted)
    cv, longest = gap_stats(words)
    paints = sorted((p, c) for p, c in zip(painted, chars) if p is not None)
    cpt = len(text) / output_tokens if output_tokens and text else None
    return {
        "client_feedback_ms": raw.get("feedback_ms"),
        "client_status_ms": raw.get("status_ms"),
        "client_first_word_ms": words[0] if words else None,
        "paint_gap_cv": cv,
        "paint_gap_max_ms": longest,
        "reader_wait_ms": reader_wait_ms(paints, reading_pace_tps * cpt / 1000) if cpt else None,
        "smoothing_hold_ms": smoothing_hold_ms(raw["arrival_ms"], raw["arrival_chars"], shown),
    }


def smoothing_label(raw) -> str:
    """The page's smoothing setting as reported with the timings: 'off', 'adaptive/word', 'pace/char'."""
    if not isinstance(raw, dict) or raw.get("mode") not in SMOOTHING_MODES or raw.get("mode") == "off":
        return "off"
    unit = raw.get("unit") if raw.get("unit") in SMOOTHING_UNITS else "word"
    return f"{raw['mode']}/{unit}"
