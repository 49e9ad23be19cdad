"""Incremental detokenization and stop strings."""

import pytest

from engine.serving.detokenize import REPLACEMENT, IncrementalDetokenizer, StopStrings

TEXTS = [
    "Café crème — naïve façade. 日本語のテキスト。 Emoji: 🧪🚀👩‍🔬 and ½ ∑ ∫ ≠ ≤.",
    "Ünïcödé everywhere: Ελληνικά, русский, עברית, العربية, हिन्दी, 한국어 🎉",
]


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_never_shows_half_a_character(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # the test only means something if some character really is split across tokens
    pieces = [tokenizer.decode([i]) for i in ids]
    assert any(REPLACEMENT in p for p in pieces)
    detok = IncrementalDetokenizer(tokenizer)
    chunks = [detok.add([i]) for i in ids] + [detok.flush()]
    assert all(REPLACEMENT not in c for c in chunks)
    assert "".join(chunks) == tokenizer.decode(ids, clean_up_tokenization_spaces=False)


def test_several_tokens_at_once_equals_one_by_one(tokenizer):
    ids = tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    a = IncrementalDetokenizer(tokenizer)
    b = IncrementalDetokenizer(tokenizer)
    one = "".join(a.add([i]) for i in ids) + a.flush()
    several = "".join(b.add(ids[i : i + 3]) for i in range(0, len(ids), 3)) + b.flush()
    assert one == several


def test_special_tokens_are_not_shown_and_a_reply_reads_as_decoded_whole(tokenizer):
    ids = tokenizer(" ".join(TEXTS), add_special_tokens=False)["input_ids"]
    ids = ids[:20] + [tokenizer.eos_token_id] + ids[20:] + [tokenizer.eos_token_id]
    detok = IncrementalDetokenizer(tokenizer)
    chunks = [detok.add([i]) for i in ids] + [detok.flush()]
    assert all(REPLACEMENT not in c for c in chunks)
    assert "".join(chunks) == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert tokenizer.eos_token not in "".join(chunks)


def test_flush_shows_a_truly_incomplete_tail(tokenizer):
    ids = tokenizer("🧪", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add(ids[:1]) == ""
    assert detok.flush() == REPLACEMENT  # the model really stopped mid-character: say so
    after_text = IncrementalDetokenizer(tokenizer)
    assert after_text.add(tokenizer("Hi", add_special_tokens=False)["input_ids"]) == "Hi"
    assert after_text.add(ids[:1]) == "" and after_text.flush() == REPLACEMENT


def feed(stops, parts):
    s = StopStrings(stops)
    shown, hit = [], False
    for p in parts:
        out, hit = s.push(p)
        shown.append(out)
        if hit:
            break
    return shown, hit, s


def test_stop_string_split_across_chunks_is_never_shown():
    shown, hit, _ = feed(["###"], ["Hello #", "#", "# world"])
    assert hit and "".join(shown) == "Hello "
    assert all("#" not in s for s in shown)


def test_held_back_text_is_released_when_it_is_not_a_stop():
    shown, hit, s = feed(["END"], ["the E", "N", "arth"])
    assert shown[:2] == ["the ", ""]  # "E", then "EN", could start "END": held back
    assert not hit and "".join(shown) + s.flush() == "the ENarth"


def test_earliest_of_several_stops_wins():
    shown, hit, _ = feed(["world", "lo"], ["hello world"])
    assert hit and "".join(shown) == "hel"


def test_no_stops_passes_everything_through():
    s = StopStrings([])
    assert s.push("abc") == ("abc", False)
    assert s.flush() == ""
