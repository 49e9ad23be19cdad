"""The per-reply trace (engine/measure/trace.py): its intervals are the Timeline's, to the microsecond,
for a streamed, a batched, a speculative and a remote reply; the JSON is well-formed Chrome Trace Event
format; the page's browser timings land on the server clock by the measured offset."""

import json

import pytest
from support import ask
from test_batching import _streamed
from test_remote import BackgroundServer, fake_server

from engine.core.config import GenerationConfig
from engine.measure.trace import chrome_trace
from engine.remote.client import RemoteEngine
from engine.serving.service import Engine

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=10)
LONG = " ".join(["the cat sat on the mat"] * 60)  # over one batching interleave chunk (256 tokens)


def check_well_formed(trace: dict) -> None:
    """What the Chrome Trace Event format asks, and what Perfetto needs to draw it."""
    json.loads(json.dumps(trace))  # plain JSON
    events = trace["traceEvents"]
    assert events
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    by_track: dict = {}
    for e in events:
        assert {"name", "ph", "pid", "tid", "ts"} <= set(e), e
        assert e["ph"] in ("X", "i", "M"), e
        assert isinstance(e["ts"], (int, float)) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            continue
        assert e["pid"] in named  # every track has a name
        assert e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        by_track.setdefault((e["pid"], e["tid"]), []).append(e["ts"])
    for ts in by_track.values():
        assert ts == sorted(ts)  # per track, in time order


def slices(trace: dict, name: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == name]


def assert_interval(event: dict, start_ns: int, end_ns: int, origin_ns: float) -> None:
    assert event["dur"] == pytest.approx((end_ns - start_ns) / 1e3, abs=1e-3)  # µs, to the ns
    assert event["ts"] == pytest.approx((start_ns - origin_ns) / 1e3, abs=1e-3)


def server_checks(tl, trace: dict, *, local: bool = True) -> None:
    """Each stage and each decode step of the trace is the Timeline's interval."""
    origin = trace["otherData"]["origin_server_ms"] * 1e6
    check_well_formed(trace)
    stages = [("queue", tl.enqueued_ns, tl.started_ns), ("decode", tl.first_token_ns, tl.last_token_ns)]
    if local:
        stages += [("setup", tl.started_ns, tl.setup_done_ns), ("prefill", tl.prefill_start_ns, tl.first_token_ns)]
    for name, start, end in stages:
        (event,) = slices(trace, name)
        assert_interval(event, start, end, origin)
    instants = sorted(set(tl.token_ns))
    steps = slices(trace, "decode step")
    assert len(steps) == len(instants) - 1
    for step, a, b in zip(steps, instants, instants[1:]):
        assert_interval(step, a, b, origin)
    assert sum(s["args"]["tokens"] for s in steps) == tl.output_tokens - tl.token_ns.count(instants[0])


def test_a_streamed_reply_with_chunked_prefill(tiny):
    engine = Engine(tiny)
    try:
        cfg = GenerationConfig(temperature=0.0, max_new_tokens=10, chunked_prefill=True, prefill_chunk_tokens=64)
        done = engine.complete(ask(LONG), cfg)
    finally:
        engine.close()
    tl = done.timeline
    trace = chrome_trace([tl.to_dict()])
    server_checks(tl, trace)
    chunks = slices(trace, "prefill chunk")
    origin = trace["otherData"]["origin_server_ms"] * 1e6
    recorded = [s for s in tl.spans if s["name"] == "prefill_chunk"]
    assert len(chunks) == len(recorded) == -(-tl.prefill_tokens // 64)
    for event, span in zip(chunks, recorded):
        assert_interval(event, span["start_ns"], span["end_ns"], origin)
    assert sum(e["args"]["tokens"] for e in chunks) == tl.prefill_tokens
    (prefill,) = slices(trace, "prefill")  # the chunks lie inside prefill
    assert all(prefill["ts"] <= c["ts"] and c["ts"] + c["dur"] <= prefill["ts"] + prefill["dur"] + 1e-3 for c in chunks)
    assert not [e for e in trace["traceEvents"] if e.get("cat") in ("browser", "network")]  # no page: absent


def test_a_batched_reply_names_its_batch_and_the_prompt_sharing_it(tiny):
    engine = Engine(tiny, max_batch=4)
    try:
        short = engine.submit(ask("Count to twenty."), GenerationConfig(temperature=0.0, max_new_tokens=40))
        _streamed(short, 2)
        long = engine.submit(ask(LONG), GREEDY)
        sd, ld = short.result(timeout=300), long.result(timeout=300)
    finally:
        engine.close()
    for done in (sd, ld):
        server_checks(done.timeline, chrome_trace([done.timeline.to_dict()]))
    steps = slices(chrome_trace([sd.timeline.to_dict()]), "decode step")
    assert max(s["args"]["batch_size"] for s in steps) == 2
    assert any(s["args"]["batch_prompt_tokens"] > 0 for s in steps)  # the long prompt shared a forward
    assert all("kernels" in s["args"] for s in steps)
    chunks = slices(chrome_trace([ld.timeline.to_dict()]), "prefill chunk")
    assert len(chunks) >= 2 and sum(c["args"]["tokens"] for c in chunks) == ld.timeline.prefill_tokens
    both = chrome_trace([("short", sd.timeline.to_dict()), ("long", ld.timeline.to_dict())])
    check_well_formed(both)
    names = {e["args"]["name"] for e in both["traceEvents"] if e["name"] == "process_name"}
    assert names == {"short · server", "long · server"}


def test_a_speculative_reply_has_drafted_and_accepted_per_step(tiny):
    engine = Engine(tiny)
    try:
        text = "one two three four five six seven eight nine ten " * 4
        cfg = GenerationConfig(temperature=0.0, max_new_tokens=24, speculative="prompt_lookup")
        done = engine.complete(ask("Repeat exactly: " + text), cfg)
    finally:
        engine.close()
    tl = done.timeline
    trace = chrome_trace([tl.to_dict()])
    server_checks(tl, trace)
    steps = slices(trace, "decode step")
    spec = [s for s in steps if "drafted" in s["args"]]
    assert sum(s["args"]["drafted"] for s in spec) == tl.counters.speculation.drafted
    assert sum(s["args"]["accepted"] for s in spec) == tl.counters.speculation.accepted
    for s in spec:  # a verify step yields its accepted guesses and one token of its own
        assert s["args"]["tokens"] <= s["args"]["accepted"] + 1


def test_a_remote_reply_leaves_the_remote_prefill_out():
    def delta(text, finish=None):
        return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}

    with BackgroundServer(fake_server([delta("Hello"), delta(","), delta(" world", "stop")])) as url:
        engine = RemoteEngine(url + "/v1", "fake")
        try:
            done = engine.complete(ask("hi"), GREEDY)
        finally:
            engine.close()
    tl = done.timeline
    trace = chrome_trace([tl.to_dict()])
    server_checks(tl, trace, local=False)
    assert not slices(trace, "prefill") and not slices(trace, "setup")  # unknown here: absent, not 0
    (waiting,) = slices(trace, "remote: waiting for the first token")
    assert_interval(waiting, tl.started_ns, tl.first_token_ns, trace["otherData"]["origin_server_ms"] * 1e6)


def test_browser_times_land_on_the_server_clock_by_the_offset():
    from engine.core.timeline import Timeline

    tl = Timeline(request_id="r1", received_ns=10_000_000_000)
    tl.enqueued_ns, tl.started_ns, tl.setup_done_ns, tl.prefill_start_ns = (tl.received_ns + d * 1_000_000
                                                                            for d in (1, 2, 3, 4))
    tl.add_tokens(1, tl.received_ns + 20_000_000)
    tl.add_chunk_out(1, tl.received_ns + 21_000_000)
    tl.add_tokens(1, tl.received_ns + 30_000_000)
    tl.add_chunk_out(2, tl.received_ns + 31_000_000)
    # browser: send at 500 ms (its clock), server = browser + 9_495 ms → send is 5 ms before received
    tl.client.update({"send_at_ms": 500.0, "clock_offset_ms": 9_495.0, "clock_bound_ms": 0.4,
                      "arrival_ms": [27.0, 38.0], "arrival_tokens": [1, 2], "paint_ms": [28.0, 39.0],
                      "shown_paint_ms": [28.0, 39.0], "shown_chars": [5, 9], "feedback_ms": 3.0, "status_ms": 6.0})
    trace = chrome_trace([("A", tl.to_dict())], network={"r1": "4G: 50 ms one way"})
    check_well_formed(trace)
    origin_ms = trace["otherData"]["origin_server_ms"]
    assert origin_ms == pytest.approx(9_995.0)  # the key press is the earliest event
    (net_in,) = slices(trace, "network in")
    assert net_in["ts"] == pytest.approx(0.0) and net_in["dur"] == pytest.approx(5_000.0)
    assert net_in["args"] == {"link": "4G: 50 ms one way", "clock_offset_ms": 9_495.0, "clock_bound_ms": 0.4}
    outs = slices(trace, "network out")
    assert [o["dur"] for o in outs] == pytest.approx([1_000.0, 2_000.0])  # handed over at 21 ms, arrived 27 − 5 = 22 ms
    paints = [e for e in trace["traceEvents"] if e["name"] == "paint"]
    assert [p["ts"] for p in paints] == pytest.approx([28_000.0, 39_000.0])
    (reply,) = slices(trace, "reply: send → last paint")
    assert reply["dur"] == pytest.approx(39_000.0)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"A · browser", "A · network", "A · server"}


def test_the_cli_writes_the_replys_trace(tiny_model_dir, tmp_path, capsys):
    from engine.cli import main

    path = tmp_path / "reply.json"
    assert main(["Hi there.", "--model", str(tiny_model_dir), "--temperature", "0", "--max-new-tokens", "6",
                 "--json", "--trace", str(path)]) == 0
    tl = json.loads(capsys.readouterr().out)["timeline"]
    trace = json.loads(path.read_text())
    check_well_formed(trace)
    origin = trace["otherData"]["origin_server_ms"] * 1e6
    ev = {k: tl["received_ns"] + round(v * 1e6) for k, v in tl["events_ms"].items() if v is not None}
    (setup,) = slices(trace, "setup")
    assert_interval(setup, ev["started"], ev["setup_done"], origin)
    steps = slices(trace, "decode step")
    assert len(steps) == tl["output_tokens"] - 1
