"""/metrics speaks vLLM's names: every metric and label that vLLM's published Grafana dashboard
queries resolves here once `vllm:` is swapped for `latency_lab:`. No model is loaded."""

from prometheus_client.parser import text_string_to_metric_families

from engine.core.counters import SpeculationCounters
from engine.core.timeline import Timeline
from server.metrics import Metrics

# The series queried by vLLM's Grafana dashboard, vllm-project/vllm
# examples/online_serving/prometheus_grafana/grafana.json (commit 004f771f3a6b49597546b05c7d83686d1e121fa0),
# each with the labels its queries filter or group by. The dashboard's model variable is
# label_values({__name__=~"vllm:.*"}, model_name).
DASHBOARD = {
    "vllm:e2e_request_latency_seconds_bucket": {"model_name", "le"},
    "vllm:e2e_request_latency_seconds_sum": {"model_name"},
    "vllm:e2e_request_latency_seconds_count": {"model_name"},
    "vllm:prompt_tokens_total": {"model_name"},
    "vllm:generation_tokens_total": {"model_name"},
    "vllm:time_per_output_token_seconds_bucket": {"model_name", "le"},
    "vllm:time_per_output_token_seconds_sum": {"model_name"},
    "vllm:time_per_output_token_seconds_count": {"model_name"},
    "vllm:num_requests_running": {"model_name"},
    "vllm:num_requests_waiting": {"model_name"},
    "vllm:time_to_first_token_seconds_bucket": {"model_name", "le"},
    "vllm:time_to_first_token_seconds_sum": {"model_name"},
    "vllm:time_to_first_token_seconds_count": {"model_name"},
    "vllm:gpu_cache_usage_perc": {"model_name"},
    "vllm:request_prompt_tokens_bucket": {"model_name", "le"},
    "vllm:request_generation_tokens_bucket": {"model_name", "le"},
    "vllm:request_success_total": {"model_name", "finished_reason"},
    "vllm:request_queue_time_seconds_sum": {"model_name"},
    "vllm:request_prefill_time_seconds_sum": {"model_name"},
    "vllm:request_decode_time_seconds_sum": {"model_name"},
    "vllm:request_max_num_generation_tokens_sum": {"model_name"},
}
# Named by the issue beyond the dashboard (vLLM's current metric set, docs/design/metrics.md).
ALSO = {
    "vllm:kv_cache_usage_perc": {"model_name", "engine"},
    "vllm:request_inference_time_seconds_sum": {"model_name", "engine"},
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": {"model_name", "engine", "position"},
    "vllm:inter_token_latency_seconds_bucket": {"model_name", "engine", "le"},
}
VLLM_FINISHED_REASONS = {"stop", "length", "abort", "error"}


class FakeCache:
    def stats(self):
        return {"bytes": 25, "budget_bytes": 100}


class FakeWorker:
    max_queue = 4

    def queue_depth(self):
        return 0

    def running(self):
        return 0


class FakeEngine:
    worker, prefix_cache = FakeWorker(), FakeCache()


def finished(reason: str, spec: bool = False) -> Timeline:
    tl = Timeline()
    t = tl.received_ns
    tl.enqueued_ns, tl.started_ns, tl.setup_done_ns, tl.prefill_start_ns = t + 10, t + 20, t + 30, t + 40
    tl.token_ns = [t + 1_000_000, t + 2_000_000, t + 3_000_000]
    tl.done_ns = t + 3_000_100
    tl.prompt_tokens, tl.cached_tokens, tl.prefill_tokens = 12, 4, 8
    tl.finish_reason = reason
    if spec:
        tl.counters.speculation = SpeculationCounters(drafted=6, accepted=3, accepted_hist=[1, 1, 1])
    return tl


def scrape(metrics: Metrics) -> dict:
    data, _ = metrics.render()
    out = {}
    for family in text_string_to_metric_families(data.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample.labels)
    return out


def test_every_series_of_vllms_dashboard_resolves_after_the_prefix_swap():
    metrics = Metrics()
    metrics.instrument(FakeEngine(), "m")
    metrics.observe(finished("stop", spec=True), "m")
    metrics.observe(finished("cancelled"), "m")
    metrics.observe(finished("error"), "m")
    series = scrape(metrics)
    missing = []
    for name, labels in {**DASHBOARD, **ALSO}.items():
        ours = "latency_lab:" + name.removeprefix("vllm:")
        if not any(labels <= set(s) for s in series.get(ours, [])):
            missing.append(name)
    assert not missing, f"vLLM dashboard series without a match here: {missing}"
    assert all(s["model_name"] == "m" and s["engine"] == "0"
               for name, ss in series.items() if name.startswith("latency_lab:") for s in ss)
    assert {s["finished_reason"] for s in series["latency_lab:request_success_total"]} == {"stop", "abort", "error"}
    assert {s["finished_reason"] for s in series["latency_lab:request_success_total"]} <= VLLM_FINISHED_REASONS
    assert "process_cpu_seconds_total" in series or "process_resident_memory_bytes" in series


def test_acceptance_per_position_and_cache_usage_values():
    metrics = Metrics()
    metrics.instrument(FakeEngine(), "m")
    metrics.observe(finished("stop", spec=True), "m")  # steps accepting 0, 1 and 2 guesses
    data, _ = metrics.render()
    values = {(s.name, s.labels.get("position")): s.value
              for f in text_string_to_metric_families(data.decode()) for s in f.samples}
    assert values[("latency_lab:spec_decode_num_accepted_tokens_per_pos_total", "0")] == 2  # two steps took guess 0
    assert values[("latency_lab:spec_decode_num_accepted_tokens_per_pos_total", "1")] == 1
    assert values[("latency_lab:kv_cache_usage_perc", None)] == 0.25
    assert values[("latency_lab:request_prompt_tokens_count", None)] == 1


def test_unknown_token_counts_are_left_out_not_counted_as_zero():
    metrics = Metrics()
    tl = finished("stop")
    tl.prompt_tokens = tl.cached_tokens = tl.prefill_tokens = None  # a remote server that did not say
    metrics.observe(tl, "far")
    data, _ = metrics.render()
    values = {s.name: s.value for f in text_string_to_metric_families(data.decode()) for s in f.samples}
    assert values.get("latency_lab:request_prompt_tokens_count", 0) == 0
    assert values.get("latency_lab:prefix_cache_queries_total", 0) == 0
