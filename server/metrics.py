"""Prometheus metrics for `GET /metrics`, named like vLLM's where the meaning matches.

vLLM's names with our prefix (`vllm:time_to_first_token_seconds` → `latency_lab:time_to_first_token_seconds`),
so dashboards written for vLLM work after a prefix change (tests/test_metrics_dashboard.py checks
every name and label of vLLM's published Grafana dashboard). Labels: `model_name` and `engine` (the
engine's index, "0", "1"..., as vLLM numbers its engine cores); `finished_reason` takes vLLM's values
(stop, length, abort, error). Every figure comes from a request's finished `Timeline`, so /metrics,
the API's `timings` and the page can never disagree. Process figures (`process_*`) come from
prometheus_client's ProcessCollector.

`Metrics.instrument(backend, name)` wraps an engine (local or remote) so that every request it
serves is counted when its consumer reads the final event, whoever submitted it: the API, the page
or a bench. A feature that did not run adds nothing: `timeline.cached_tokens` (KV reuse) and
`timeline.counters.speculation`'s `drafted`, `accepted`, `accepted_hist` (speculative decoding).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from engine.core.errors import LatencyLabError
from engine.core.timeline import Timeline

PREFIX = "latency_lab:"
LABEL = "model_name"
ENGINE = "engine"
LABELS = [LABEL, ENGINE]
# Our finish reasons → vLLM's `finished_reason` label values.
FINISHED_REASON = {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}
MAX_SPEC_POSITIONS = 32  # per-position acceptance kept for the first guesses (more than any k we use)
# vLLM's buckets (seconds), so histograms from both line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)  # vLLM's 1-2-5
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


def _s(ms):
    return None if ms is None else ms / 1e3


def _ms(start_ns, end_ns):
    return None if start_ns is None or end_ns is None else (end_ns - start_ns) / 1e6


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        # A registry of our own: two apps in one process (tests, A/B) never collide.
        self.registry = registry or CollectorRegistry()
        r, p, lb = self.registry, PREFIX, LABELS
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes...

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
        # vLLM's older name for the inter-token gaps (its dashboards still plot it)
        self.itl_legacy = hist("time_per_output_token_seconds", "itl_ms[i], per gap (vLLM's legacy name)",
                               ITL_BUCKETS)
        self.inference = hist("request_inference_time_seconds",
                              "worker starts it → last token sampled (vLLM: time in the RUNNING phase)",
                              REQUEST_BUCKETS)
        self.prompt_hist = hist("request_prompt_tokens", "prompt_tokens per finished request", TOKEN_BUCKETS)
        self.generation_hist = hist("request_generation_tokens", "output_tokens per finished request",
                                    TOKEN_BUCKETS)
        self.max_generation_hist = hist("request_max_num_generation_tokens",
                                        "output_tokens of the longest sequence of the request (n=1: output_tokens)",
                                        TOKEN_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "e2e_ms: request received → last chunk handed to the transport",
                        REQUEST_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "queue_ms: enqueued → the worker starts it", REQUEST_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "prefill_ms: prefill forward begins → first token sampled",
                            REQUEST_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "decode_ms: first → last token sampled", REQUEST_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "output tokens of finished requests")
        self.success = counter("request_success", "finished requests by finish reason (vLLM's values)",
                               [*LABELS, "finished_reason"])
        self.prefix_queries = counter("prefix_cache_queries", "prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("prefix_cache_hits", "prompt tokens served from the prefix cache (cached_tokens)")
        self.spec_drafts = counter("spec_decode_num_drafts", "speculative steps that proposed tokens")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "tokens proposed (drafted)")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens", "proposed tokens accepted")
        self.spec_accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                             "guesses accepted at each position of a speculative step",
                                             [*LABELS, "position"])
        self.running = Gauge(p + "num_requests_running", "requests being generated", lb, registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "requests waiting in the queue", lb, registry=r)
        self.kv_usage = Gauge(p + "kv_cache_usage_perc", "prefix cache (KV reuse) bytes in use / its budget, 0-1",
                              lb, registry=r)
        self.kv_usage_legacy = Gauge(p + "gpu_cache_usage_perc", "the same as kv_cache_usage_perc (vLLM's older name)",
                                     lb, registry=r)
        self.engines: dict[str, str] = {}  # model name → engine label
        self.listeners: list = []  # f(timeline, model_name), told of each finished request after it is counted
        self.api_errors = Counter(p + "api_errors", "API requests answered with an error, by HTTP status",
                                  ["status"], registry=r)

    # --- recording ---------------------------------------------------------------------------
    def observe(self, timeline: Timeline, model_name: str) -> None:
        """Record one finished request (done or error) from its Timeline."""
        m = {LABEL: model_name, ENGINE: self.engines.get(model_name, "0")}
        inference = _s(_ms(timeline.started_ns, timeline.last_token_ns))
        for hist, value in ((self.ttft, _s(timeline.ttft_ms)), (self.tpot, _s(timeline.tpot_ms)),
                            (self.e2e, _s(timeline.e2e_ms)), (self.queue, _s(timeline.queue_ms)),
                            (self.prefill, _s(timeline.prefill_ms)), (self.decode, _s(timeline.decode_ms)),
                            (self.inference, inference)):
            if value is not None:
                hist.labels(**m).observe(value)
        itl, legacy = self.itl.labels(**m), self.itl_legacy.labels(**m)
        for gap in timeline.itl_ms:
            itl.observe(gap / 1e3)
            legacy.observe(gap / 1e3)
        prompt, out = timeline.prompt_tokens, timeline.output_tokens
        self.prompt_tokens.labels(**m).inc(prompt or 0)
        self.generation_tokens.labels(**m).inc(out)
        if prompt:  # unknown (a remote server that did not say) is left out, not counted as 0
            self.prompt_hist.labels(**m).observe(prompt)
        self.generation_hist.labels(**m).observe(out)
        self.max_generation_hist.labels(**m).observe(out)
        reason = FINISHED_REASON.get(timeline.finish_reason or "", "error")
        self.success.labels(**m, finished_reason=reason).inc()
        if prompt and timeline.cached_tokens is not None:  # a hit rate needs both; nothing was queried before tokenizing
            self.prefix_queries.labels(**m).inc(prompt)
            self.prefix_hits.labels(**m).inc(timeline.cached_tokens)
        spec = timeline.counters.speculation
        drafted, accepted = (_count(spec.drafted), _count(spec.accepted)) if spec else (0, 0)  # nothing to add
        hist = [_count(n) for n in (spec.accepted_hist if spec and spec.accepted_hist else ())]  # [j]: verify steps that accepted j guesses
        steps = sum(hist)  # verify steps that had guesses
        self.spec_drafts.labels(**m).inc(steps)
        self.spec_draft_tokens.labels(**m).inc(drafted)
        self.spec_accepted.labels(**m).inc(accepted)
        for pos in range(min(len(hist) - 1, MAX_SPEC_POSITIONS)):  # guess `pos` accepted ⇔ more than pos accepted
            self.spec_accepted_per_pos.labels(**m, position=str(pos)).inc(sum(hist[pos + 1:]))
        for listener in self.listeners:
            listener(timeline, model_name)

    def observe_abandoned(self, model_name: str) -> None:
        """A consumer stopped reading before the end (a client went away): vLLM's `abort`."""
        self.success.labels(model_name, self.engines.get(model_name, "0"), "abort").inc()

    def watch(self, backend, model_name: str) -> None:
        """Gauges read live at each scrape: a local engine's queue and prefix cache (a remote engine:
        its requests in flight; its cache is the server's own)."""
        engine = self.engines.get(model_name, "0")
        running, waiting = self.running.labels(model_name, engine), self.waiting.labels(model_name, engine)
        worker = getattr(backend, "worker", None)
        if worker is not None:
            running.set_function(lambda: float(worker.running()))
            waiting.set_function(lambda: float(worker.queue_depth()))
        elif hasattr(backend, "in_flight"):
            running.set_function(lambda: float(backend.in_flight()))
            waiting.set(0)
        cache = getattr(backend, "prefix_cache", None)
        if cache is not None and hasattr(cache, "stats"):
            def usage() -> float:
                st = cache.stats()
                return st["bytes"] / st["budget_bytes"] if st["budget_bytes"] else 0.0

            self.kv_usage.labels(model_name, engine).set_function(usage)
            self.kv_usage_legacy.labels(model_name, engine).set_function(usage)

    def instrument(self, backend, model_name: str, engine: str = "0") -> ObservedBackend:
        self.engines[model_name] = str(engine)
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
