"""Prometheus metrics for `GET /metrics`, named like vLLM's where the meaning matches.

vLLM's names with our prefix (`vllm:time_to_first_token_seconds` → `latency_lab:time_to_first_token_seconds`),
so dashboards written for vLLM work after a prefix change. Every figure comes from a request's
finished `Timeline`, so /metrics, the API's `timings` and the page can never disagree.

`Metrics.instrument(backend, name)` wraps an engine (local or remote) so that every request it
serves is counted when its consumer reads the final event, whoever submitted it: the API, the page
or a bench. Feature counters are read defensively (missing → 0): `timeline.cached_tokens` (KV
reuse) and `timeline.counters` keys `drafted`, `accepted`, `accepted_hist` (speculative decoding).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.errors import LatencyLabError
from engine.timeline import Timeline

PREFIX = "latency_lab:"
LABEL = "model_name"
# vLLM's buckets (seconds), so histograms from both line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


def _s(ms):
    return None if ms is None else ms / 1e3


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        # A registry of our own: two apps in one process (tests, A/B) never collide.
        self.registry = registry or CollectorRegistry()
        r, p, lb = self.registry, PREFIX, [LABEL]

        def hist(name, doc, buckets):
            return Histogram(p + name, doc, lb, buckets=buckets, registry=r)

        def counter(name, doc, labels=lb):
            return Counter(p + name, doc, labels, registry=r)

        self.ttft = hist("time_to_first_token_seconds", "ttft_ms: request received → first token sampled",
                         TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "itl_ms[i]: token i-1 sampled → token i sampled",
                        ITL_BUCKETS)
        self.tpot = hist("request_time_per_output_token_seconds",
                         "tpot_ms: first → last token sampled, / (output_tokens - 1)", ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "e2e_ms: request received → last chunk handed to the transport",
                        REQUEST_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "queue_ms: enqueued → the worker starts it", REQUEST_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "prefill_ms: prefill forward begins → first token sampled",
                            REQUEST_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "decode_ms: first → last token sampled", REQUEST_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "output tokens of finished requests")
        self.success = counter("request_success", "finished requests by finish reason",
                               [LABEL, "finished_reason"])
        self.prefix_queries = counter("prefix_cache_queries", "prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "prompt tokens served from the prefix cache (cached_tokens)")
        self.spec_drafts = counter("spec_decode_num_drafts", "speculative steps that proposed tokens")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "tokens proposed (drafted)")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "proposed tokens accepted")
        self.running = Gauge(p + "num_requests_running", "requests being generated", lb, registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "requests waiting in the queue", lb, registry=r)
        self.api_errors = Counter(p + "api_errors", "API requests answered with an error, by HTTP status",
                                  ["status"], registry=r)

    # --- recording ---------------------------------------------------------------------------
    def observe(self, timeline: Timeline, model_name: str) -> None:
        """Record one finished request (done or error) from its Timeline."""
        m = {LABEL: model_name}
        for hist, value in ((self.ttft, _s(timeline.ttft_ms)), (self.tpot, _s(timeline.tpot_ms)),
                            (self.e2e, _s(timeline.e2e_ms)), (self.queue, _s(timeline.queue_ms)),
                            (self.prefill, _s(timeline.prefill_ms)), (self.decode, _s(timeline.decode_ms))):
            if value is not None:
                hist.labels(**m).observe(value)
        itl = self.itl.labels(**m)
        for gap in timeline.itl_ms:
            itl.observe(gap / 1e3)
        self.prompt_tokens.labels(**m).inc(timeline.prompt_tokens or 0)
        self.generation_tokens.labels(**m).inc(timeline.output_tokens)
        self.success.labels(model_name, timeline.finish_reason or "unknown").inc()
        if timeline.prompt_tokens:  # a request that failed before tokenizing queried nothing
            self.prefix_queries.labels(**m).inc(timeline.prompt_tokens)
            self.prefix_hits.labels(**m).inc(timeline.cached_tokens or 0)
        c = timeline.counters
        drafted, accepted = _count(c.get("drafted")), _count(c.get("accepted"))
        steps = sum(_count(n) for n in (c.get("accepted_hist") or ()))  # verify steps that had guesses
        self.spec_drafts.labels(**m).inc(steps)
        self.spec_draft_tokens.labels(**m).inc(drafted)
        self.spec_accepted.labels(**m).inc(accepted)

    def observe_abandoned(self, model_name: str) -> None:
        """A consumer stopped reading before the end (a client went away): counted as cancelled."""
        self.success.labels(model_name, "cancelled").inc()

    def watch(self, backend, model_name: str) -> None:
        """Queue gauges read live from a local engine's worker (a remote engine: its requests in flight)."""
        worker = getattr(backend, "worker", None)
        if worker is not None:
            self.running.labels(model_name).set_function(lambda: 1.0 if worker.busy else 0.0)
            self.waiting.labels(model_name).set_function(lambda: float(worker.queue_depth()))
        elif hasattr(backend, "in_flight"):
            self.running.labels(model_name).set_function(lambda: float(backend.in_flight()))
            self.waiting.labels(model_name).set(0)

    def instrument(self, backend, model_name: str) -> ObservedBackend:
        self.watch(backend, model_name)
        return ObservedBackend(backend, self, model_name)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _count(value) -> int:
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError):
        return 0


class ObservedBackend:
    """An engine whose requests are recorded in `metrics` when their final event is read."""

    def __init__(self, backend, metrics: Metrics, model_name: str):
        self.backend, self.metrics, self.model_name = backend, metrics, model_name

    def submit(self, *args, **kwargs) -> ObservedHandle:
        return ObservedHandle(self.backend.submit(*args, **kwargs), self)

    def __getattr__(self, name):  # info(), tokenizer, worker, close()... come from the engine
        return getattr(self.backend, name)


class ObservedHandle:
    """A request handle that reports its Timeline to the metrics once, at its done/error event."""

    def __init__(self, handle, owner: ObservedBackend):
        self.handle, self.owner = handle, owner
        self.observed = False

    def _seen(self, event) -> None:
        if event.kind in ("done", "error") and not self.observed:
            self.observed = True
            self.owner.metrics.observe(self.handle.timeline, self.owner.model_name)

    def _abandoned(self) -> None:
        if not self.observed:
            self.observed = True
            self.owner.metrics.observe_abandoned(self.owner.model_name)

    def events(self, timeout: float | None = None):
        try:
            for event in self.handle.events(timeout=timeout):
                self._seen(event)
                yield event
        finally:
            self._abandoned()

    async def aevents(self):
        try:
            async for event in self.handle.aevents():
                self._seen(event)
                yield event
        finally:
            self._abandoned()

    def result(self, timeout: float | None = None):
        for event in self.events(timeout=timeout):
            if event.kind == "error":
                raise event.detail.get("exception") or LatencyLabError(event.detail.get("message", "failed"))
        return self.handle.final

    def __getattr__(self, name):  # timeline, final, id, cancel(), request...
        return getattr(self.handle, name)
