"""Traces through the API (openai SDK): `?trace=true` puts the reply's trace in `timings`, GET
/v1/trace/{id} answers it later; with an OTLP endpoint, every request reaches a real OTLP/HTTP
receiver (a small http.server started here) as spans — decoded with opentelemetry-proto — with the
GenAI attributes, a child per stage, and the caller's `traceparent` continued."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from support import ask
from test_trace import check_well_formed, server_checks, slices

from engine.core.config import GenerationConfig
from engine.measure.otel import traces_url
from engine.serving.service import Engine
from server.api import create_api
from server.cli import server_parser
from server.run import BackgroundServer

TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CHUNKED = {"temperature": 0.0, "chunked_prefill": True, "prefill_chunk_tokens": 16}


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: keeps every decoded ExportTraceServiceRequest."""

    def __init__(self):
        self.requests, self.paths = [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.paths.append((self.path, self.headers.get("Content-Type")))
                outer.requests.append(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list:
        return [s for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    def close(self):
        self.server.shutdown()


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


@pytest.fixture(scope="module")
def api(tiny):
    receiver = Receiver()
    engine = Engine(tiny)
    app = create_api(engine, otlp_endpoint=receiver.url)
    with BackgroundServer(app) as url:
        yield type("Api", (), {"url": url, "app": app, "receiver": receiver, "model": engine.info().name,
                               "client": openai.OpenAI(base_url=url + "/v1", api_key="none")})
    engine.close()
    receiver.close()


def test_the_flag_names_the_collector():
    args = server_parser("app.py", "").parse_args(["--otlp-endpoint", "http://127.0.0.1:4318"])
    assert args.otlp_endpoint == "http://127.0.0.1:4318"
    assert traces_url(args.otlp_endpoint) == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://c:4318/custom/path") == "http://c:4318/custom/path"


def test_a_reply_with_its_trace_and_the_same_trace_by_id(api):
    prompt = "Tell me about the sea and the boats on it, " * 4
    resp = api.client.chat.completions.with_raw_response.create(
        model=api.model, messages=ask(prompt), max_tokens=6, extra_body=CHUNKED, extra_query={"trace": "true"})
    completion = resp.parse()
    request_id = resp.headers["x-request-id"]
    trace = completion.model_extra["timings"]["trace"]
    tl = api.app.state.traces.timeline(request_id)
    server_checks(tl, trace)
    assert len(slices(trace, "prefill chunk")) == -(-tl.prefill_tokens // 16)
    for some_id in (request_id, completion.id):  # by the X-Request-Id or by the completion's id
        later = httpx.get(f"{api.url}/v1/trace/{some_id}").json()
        assert later == trace
    missing = httpx.get(f"{api.url}/v1/trace/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_streamed_reply_carries_its_trace_in_the_final_timings(api):
    stream = api.client.chat.completions.create(model=api.model, messages=ask("Say hi."), max_tokens=5, stream=True,
                                                extra_body={"temperature": 0.0}, extra_query={"trace": "1"})
    timings = [c.model_extra["timings"] for c in stream if c.model_extra.get("timings")]
    (trace,) = [t["trace"] for t in timings]
    check_well_formed(trace)
    tl = api.app.state.traces.timeline(trace["otherData"]["replies"][0]["request_id"])
    server_checks(tl, trace)


def test_otlp_spans_reach_a_receiver_and_continue_the_callers_trace(api):
    resp = api.client.chat.completions.with_raw_response.create(
        model=api.model, messages=ask("A few words on rivers, lakes and the sea, please. " * 3), max_tokens=6,
        extra_body=CHUNKED, extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    request_id = resp.headers["x-request-id"]
    assert api.app.state.traces.otlp.flush()
    assert api.receiver.paths and all(p == ("/v1/traces", "application/x-protobuf") for p in api.receiver.paths)
    spans = [s for s in api.receiver.spans() if s.trace_id.hex() == TRACE_ID]
    (root,) = [s for s in spans if s.name == f"chat {api.model}"]
    assert root.parent_span_id.hex() == PARENT_ID  # the caller's span is the parent
    a = attrs(root)
    tl = api.app.state.traces.timeline(request_id)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == api.model
    assert a["gen_ai.usage.input_tokens"] == tl.prompt_tokens and a["gen_ai.usage.output_tokens"] == tl.output_tokens
    assert a["gen_ai.response.id"] == request_id and a["gen_ai.response.finish_reasons"] == [tl.finish_reason]
    assert a["latency_lab.ttft_ms"] == pytest.approx(tl.ttft_ms)
    stages = {s.name: s for s in spans if s.parent_span_id == root.span_id}
    assert set(stages) == {"queue", "setup", "prefill", "decode"}
    for name, start, end in (("queue", tl.enqueued_ns, tl.started_ns), ("setup", tl.started_ns, tl.setup_done_ns),
                             ("prefill", tl.prefill_start_ns, tl.first_token_ns),
                             ("decode", tl.first_token_ns, tl.last_token_ns)):
        s = stages[name]
        assert s.end_time_unix_nano - s.start_time_unix_nano == end - start  # the Timeline's interval, to the ns
    for a_, b_ in (("queue", "setup"), ("setup", "prefill")):  # one clock: the stages abut as on the Timeline
        assert stages[a_].end_time_unix_nano == stages[b_].start_time_unix_nano or a_ == "setup"
    chunks = [s for s in spans if s.name == "prefill chunk"]
    assert chunks and all(c.parent_span_id == stages["prefill"].span_id for c in chunks)
    assert sum(attrs(c)["latency_lab.tokens"] for c in chunks) == tl.prefill_tokens


def test_without_traceparent_a_request_starts_its_own_trace(api):
    before = {s.span_id for s in api.receiver.spans()}
    api.client.chat.completions.create(model=api.model, messages=ask("Hi."), max_tokens=3,
                                       extra_body={"temperature": 0.0})
    assert api.app.state.traces.otlp.flush()
    roots = [s for s in api.receiver.spans() if s.span_id not in before and s.name.startswith("chat ")]
    assert len(roots) == 1 and not roots[0].parent_span_id and roots[0].trace_id.hex() != TRACE_ID


def test_the_pages_trace_route_reads_a_load_runs_requests_from_the_api(tiny):
    """The Load tab's clients go through /v1: /lab/trace finds those ids among the API's finished requests,
    one process per request, and refuses an id it has nowhere."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from server.tracing import RequestTraces
    from ui.chat.store import ChatStore
    from ui.trace.routes import trace_router

    engine = Engine(tiny)
    try:
        done = [engine.complete(ask(f"Count to {n}."), GenerationConfig(temperature=0.0, max_new_tokens=4))
                for n in (3, 4)]
        store = ChatStore(engine)
        app = FastAPI()
        app.state.traces = RequestTraces()
        for d in done:
            app.state.traces.finished(d.timeline, "tiny")
        app.include_router(trace_router(store))
        client, session = TestClient(app), store.new_session()
        ids = [d.timeline.request_id for d in done]
        trace = client.post("/lab/trace", json={"session": session, "ids": ids, "labels": ["c1", "c2"]}).json()
        check_well_formed(trace)
        names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
        assert names == {"c1 · server", "c2 · server"}
        for d in done:
            pid = next(r for r in trace["otherData"]["replies"] if r["request_id"] == d.timeline.request_id)
            assert pid["browser_pid"] is None  # no page timings: no browser track, not an empty one
        missing = client.post("/lab/trace", json={"session": session, "ids": ["req-nope"]})
        assert missing.status_code == 404
        bad = client.post("/lab/trace", json={"session": session, "ids": ["no/such id"]})
        assert bad.status_code == 400
    finally:
        engine.close()
