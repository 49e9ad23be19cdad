"""Each request as OpenTelemetry spans, sent over OTLP/HTTP (`--otlp-endpoint URL`).

One span per request (`chat MODEL`, the GenAI conventions' span name) from `received` to the last
chunk handed over, a child per stage (queue, setup, prefill, decode — the trace's server stages,
engine/measure/trace.py, so the two cannot disagree) and, under its stage, the work inside it (KV
lookup, compile, each prefill chunk, a reply's thinking; a remote request's network phases: DNS,
connect, TLS, request sent, response headers). The first token and first answer token are events
of the request span. Attributes use the GenAI semantic conventions' names where
one exists (`gen_ai.*`, below) and `latency_lab.*` for ours (the glossary's names); unknown values
are left out, never 0. A W3C `traceparent` on the request continues the caller's trace
(`parent_from`, opentelemetry's own propagator).

One clock: the Timeline's readings of the one clock (engine/core/clock.py) become epoch ns by one offset taken once per
process (`EPOCH_MINUS_PERF_NS`), so span times keep the Timeline's intervals exactly.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.core import clock
from .trace import network_phase_spans, server_spans

EPOCH_MINUS_PERF_NS = time.time_ns() - clock.now_ns()  # once per process: one clock
STAGES = ("queue", "setup", "prefill", "decode", "remote: waiting for the first token")
EVENTS = ("first token", "first answer token")  # the trace's instants kept as events of the request span
PROVIDER = "latency_lab"
MAX_PARENTS = 4096  # callers' trace contexts waiting for their request to finish


def epoch_ns(perf_ns: float) -> int:
    return round(perf_ns + EPOCH_MINUS_PERF_NS)


def traces_url(endpoint: str) -> str:
    """An OTLP/HTTP base URL (http://host:4318) gets the traces path; a full URL is kept."""
    return endpoint.rstrip("/") + "/v1/traces" if urlsplit(endpoint).path in ("", "/") else endpoint


def gen_ai_attributes(tl: dict, model: str) -> dict:
    """The request span's attributes: GenAI conventions' names, then ours (latency_lab.*)."""
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.response.id": tl.get("request_id"),
        "gen_ai.usage.input_tokens": tl.get("prompt_tokens"),
        "gen_ai.usage.output_tokens": tl.get("output_tokens"),
        "gen_ai.usage.cache_read.input_tokens": tl.get("cached_tokens"),
        "gen_ai.response.finish_reasons": [tl["finish_reason"]] if tl.get("finish_reason") else None,
    }
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "setup_ms", "prefill_ms", "decode_ms", "decode_tps",
                "prefill_tokens", "queue_position", "drafted", "accepted", "acceptance_rate", "quantization",
                "batching", "measured_at", "kv_reuse", "ttft_thought_ms", "thinking_ms", "ttfa_ms", "thought_tokens",
                "thought_source", "net_dns_ms", "net_connect_ms", "net_tls_ms", "net_send_ms", "net_headers_ms",
                "connection_reused"):
        attrs[f"latency_lab.{key}"] = tl.get(key)
    return {k: v for k, v in attrs.items() if v is not None and isinstance(v, (str, bool, int, float, list))}


def _scalars(args: dict) -> dict:
    return {f"latency_lab.{k}": v for k, v in args.items() if isinstance(v, (str, bool, int, float))}


class OtlpExport:
    """Exports finished requests' Timelines as spans (`exporter`: any SpanExporter; default OTLP/HTTP)."""

    def __init__(self, endpoint: str | None = None, *, exporter: SpanExporter | None = None,
                 service_name: str = "latency-lab"):
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self.provider.get_tracer("latency_lab")
        self.propagator = TraceContextTextMapPropagator()
        self._parents: OrderedDict[str, Context] = OrderedDict()

    def parent_from(self, request_id: str, headers) -> None:
        """Keep the caller's trace context (`traceparent`/`tracestate` headers) for this request."""
        ctx = self.propagator.extract(carrier={k.lower(): v for k, v in headers.items()})
        if ctx:
            self._parents[request_id] = ctx
            while len(self._parents) > MAX_PARENTS:
                self._parents.popitem(last=False)

    def export(self, timeline, model: str) -> None:
        """The request span and its children, from the finished Timeline (queued to the exporter)."""
        tl = timeline.to_dict()
        parent = self._parents.pop(tl.get("request_id"), None)
        every = server_spans(tl) + network_phase_spans(tl)
        spans = [s for s in every if s.end_ns is not None and s.name != "decode step"]
        start = tl["received_ns"]
        end = timeline.end_ns or timeline.done_ns or start
        root = self.tracer.start_span(f"chat {model}", context=parent, kind=SpanKind.SERVER,
                                      start_time=epoch_ns(start), attributes=gen_ai_attributes(tl, model))
        if tl.get("finish_reason") == "error":
            root.set_status(Status(StatusCode.ERROR))
        for s in every:
            if s.end_ns is None and s.name in EVENTS:
                root.add_event(s.name, _scalars(s.args), timestamp=epoch_ns(s.start_ns))
        stages = [s for s in spans if s.name in STAGES]
        opened = {}
        for s in stages:
            opened[id(s)] = self.tracer.start_span(s.name, context=set_span_in_context(root),
                                                   start_time=epoch_ns(s.start_ns), attributes=_scalars(s.args))
        for s in spans:
            if s.name in STAGES:
                continue
            home = next((st for st in stages if st.start_ns <= s.start_ns and s.end_ns <= st.end_ns), None)
            parent_span = opened[id(home)] if home is not None else root
            child = self.tracer.start_span(s.name, context=set_span_in_context(parent_span),
                                           start_time=epoch_ns(s.start_ns), attributes=_scalars(s.args))
            child.end(end_time=epoch_ns(s.end_ns))
        for s in stages:
            opened[id(s)].end(end_time=epoch_ns(s.end_ns))
        root.end(end_time=epoch_ns(end))

    def flush(self, timeout_ms: int = 10_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.provider.shutdown()
