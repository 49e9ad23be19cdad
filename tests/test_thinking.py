"""Thinking vs answering (engine/core/thinking.py): one scanner finds where a reply's opening thought
starts and ends and where its answer begins, whatever the chunking; the Timeline stamps those at
the sampling of the tokens that carried them; the text keeps the thought, marked; the API's
timings, the trace and the OpenTelemetry spans carry the figures. A local source (the paced test
source) streams a scripted think block; the remote dialects are in test_remote_dialects.py. No model."""

import itertools

import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import ask

from engine.core.config import GenerationConfig
from engine.core.thinking import (
    MARKS,
    ReasoningText,
    ThoughtScan,
    perceived_thinking,
    thought_marks,
)
from engine.measure.otel import OtlpExport
from engine.measure.trace import chrome_trace
from server.api import create_api
from server.run import BackgroundServer
from ui.chat.paced import THINK, PacedSource

REPLY = "  <think>\nFirst, the capital.</think>\n\nParis."


@pytest.mark.parametrize("text, marks", [
    (REPLY, {"thought": REPLY.index("First"), "end": REPLY.index("</think>") + 7, "answer": REPLY.index("Paris")}),
    ("Paris.", {"thought": None, "end": None, "answer": 0}),
    ("\n Paris <think>no</think>", {"thought": None, "end": None, "answer": 2}),  # a tag mid-answer is answer text
    ("<think></think>Hi", {"thought": None, "end": 14, "answer": 15}),
    ("<think>still thinking", {"thought": 7, "end": None, "answer": None}),  # cut off while thinking
    ("<thin", {"thought": None, "end": None, "answer": 0}),  # no tag after all: answer text
    ("<think>x</thi", {"thought": 7, "end": None, "answer": None}),
])
def test_the_marks_of_a_whole_reply(text, marks):
    assert thought_marks(text) == marks


def test_any_chunking_gives_the_same_marks():
    """A tag cut anywhere between chunks (a tokenizer splits `</think>` as it likes)."""
    whole = thought_marks(REPLY)
    for i, j in itertools.combinations(range(len(REPLY) + 1), 2):
        scan, marks = ThoughtScan(), dict.fromkeys(MARKS)
        for piece in (REPLY[:i], REPLY[i:j], REPLY[j:]):
            marks.update(scan.feed(piece))
        marks.update(scan.close())
        assert marks == whole, (i, j)


def test_reasoning_deltas_become_a_marked_thought():
    r = ReasoningText()
    text = r.piece("Let me", "") + r.piece(" see.", "") + r.piece("", "\n\nParis") + r.piece("", ".")
    assert text == "<think>Let me see.</think>\n\nParis."
    assert thought_marks(text)["answer"] == text.index("Paris")


def run_paced(think: bool, tokens: int = 24):
    source = PacedSource(2000.0, prefill_ms=1.0, think=think)
    try:
        return source.submit(ask("hi"), GenerationConfig(max_new_tokens=tokens)).result(timeout=30)
    finally:
        source.close()


def test_a_local_source_streaming_a_think_block_stamps_thought_end_and_answer():
    done = run_paced(think=True)
    tl = done.timeline
    # the text is honest: the thought stays in it, marked
    assert done.text.startswith("<think>\nThe user wants") and "</think>\n\n" in done.text
    first = THINK.index("The")  # "<think>" and "\n" are no thought yet
    close = THINK.index("</think>")
    answer = len(THINK)  # the first word after the block's "\n\n"
    assert tl.thought_first_ns == tl.token_ns[first]
    assert tl.thought_end_ns == tl.token_ns[close]
    assert tl.answer_first_ns == tl.token_ns[answer]
    assert tl.thought_tokens == close + 1
    m = tl.metrics()
    assert m["ttft_thought_ms"] == pytest.approx((tl.token_ns[first] - tl.received_ns) / 1e6)
    assert m["thinking_ms"] == pytest.approx((tl.token_ns[close] - tl.token_ns[first]) / 1e6)
    assert m["ttft_ms"] < m["ttft_thought_ms"] < m["ttfa_ms"]
    assert tl.counters.thought_source == "text"
    d = tl.to_dict()
    assert d["events_ms"]["thought_first"] < d["events_ms"]["thought_end"] < d["events_ms"]["answer_first"]
    assert "thought at" in tl.summary()


def test_a_reply_without_a_thought_answers_at_its_first_token():
    tl = run_paced(think=False).timeline
    m = tl.metrics()
    assert m["ttft_thought_ms"] is None and m["thinking_ms"] is None and m["thought_tokens"] is None
    assert m["ttfa_ms"] == m["ttft_ms"]
    assert tl.counters.thought_source is None


def test_a_thought_cut_by_max_tokens_never_ends():
    tl = run_paced(think=True, tokens=6).timeline
    assert tl.thought_first_ns is not None and tl.thinking_ms is None and tl.ttfa_ms is None
    assert tl.thought_tokens == 6  # every token was thought


def test_the_api_timings_carry_the_thinking_figures():
    source = PacedSource(2000.0, prefill_ms=1.0, think=True)
    try:
        with BackgroundServer(create_api({"paced": source})) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
            parts, timings = [], None
            for chunk in client.chat.completions.create(model="paced", messages=ask("hi"), max_tokens=24,
                                                        stream=True):
                parts += [c.delta.content or "" for c in chunk.choices]
                timings = (chunk.model_extra or {}).get("timings") or timings
    finally:
        source.close()
    assert "".join(parts).startswith("<think>")
    assert timings["ttft_ms"] < timings["ttft_thought_ms"] < timings["ttfa_ms"]
    assert timings["thinking_ms"] > 0 and timings["thought_tokens"] == THINK.index("</think>") + 1
    assert timings["events_ms"]["answer_first"] == pytest.approx(timings["ttfa_ms"])


def test_the_trace_and_the_otel_spans_show_thinking():
    tl = run_paced(think=True).timeline
    events = chrome_trace([tl.to_dict()])["traceEvents"]
    thinking = [e for e in events if e["name"] == "thinking"]
    assert len(thinking) == 1 and thinking[0]["dur"] == pytest.approx(tl.thinking_ms * 1e3, abs=0.01)
    assert thinking[0]["args"]["thought_tokens"] == tl.thought_tokens
    assert [e for e in events if e["name"] == "first answer token"]

    exporter = InMemorySpanExporter()
    export = OtlpExport(exporter=exporter)
    export.export(tl, "paced")
    export.flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["chat paced"]
    assert spans["thinking"].parent.span_id == spans["decode"].context.span_id
    assert (spans["thinking"].end_time - spans["thinking"].start_time) == pytest.approx(tl.thinking_ms * 1e6, abs=2)
    assert root.attributes["latency_lab.ttfa_ms"] == pytest.approx(tl.ttfa_ms)
    assert root.attributes["latency_lab.thought_source"] == "text"
    assert "first answer token" in [e.name for e in root.events]
    export.shutdown()


def test_perceived_thinking_reads_the_paint_log():
    text = "<think>Hm.</think>\n\nYes."
    # the page showed 4, 9, 18 and all characters, painted at 100, 120, 150 and 190 ms after send
    figures = perceived_thinking(text, [4, 9, 18, len(text)], [100.0, 120.0, 150.0, 190.0])
    assert figures == {"client_ttft_thought_ms": 120.0, "client_thinking_ms": 30.0, "client_ttfa_ms": 190.0}
    assert perceived_thinking("Yes.", [4], [None]) == {"client_ttft_thought_ms": None, "client_thinking_ms": None,
                                                       "client_ttfa_ms": None}


def test_the_local_engine_stamps_its_first_answer_token(bundled_engine):
    """The engine's chunks pass the same scanner: a reply with no thought answers at its first visible token."""
    tl = bundled_engine.complete(ask("What is the capital of France?"),
                                 GenerationConfig(temperature=0.0, max_new_tokens=8)).timeline
    assert tl.answer_first_ns == tl.token_ns[0] and tl.ttfa_ms == tl.ttft_ms
    assert tl.thought_first_ns is None and tl.thinking_ms is None


def test_every_thinking_figure_is_in_the_glossary():
    from ui.shell.glossary import METRICS

    for name in ("ttft_thought_ms", "thinking_ms", "ttfa_ms", "thought_tokens", "thought_source",
                 "client_ttft_thought_ms", "client_thinking_ms", "client_ttfa_ms"):
        assert METRICS[name].end, name
    for name in ("client_ttft_thought_ms", "client_thinking_ms", "client_ttfa_ms"):
        assert METRICS[name].clock == "browser"
