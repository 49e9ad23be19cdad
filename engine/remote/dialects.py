"""Each server's own report of a request, read onto the Timeline (the server's clock).

One reader per server (ours, llama.cpp, vLLM, Ollama, TGI), each naming where its format is
documented, maps its fields onto our glossary; `absorb` and `apply_usage` put the result on the
Timeline. Nothing is guessed: a figure the server did not report stays unknown.
"""

from __future__ import annotations

from engine.core.counters import RemoteCounters, SpeculationCounters
from engine.core.timeline import Timeline


def server_timings(payload: dict) -> dict:
    """Timing fields a server put in a chunk or body, raw (ours and llama.cpp: `timings`; vLLM: `metrics`)."""
    found = {}
    for key in ("timings", "metrics"):
        if isinstance(payload.get(key), dict):
            found.update(payload[key])
    return found


# --- each server's report, mapped onto our glossary (the server's own clock) ---------------------
# Keys: queue_ms, ttft_ms (from the server's receipt), ttft_source, prefill_ms, decode_ms, e2e_ms,
# prompt_tokens, cached_tokens, prefill_tokens, output_tokens, drafted, accepted. A key is present
# only when the server reported it; nothing is guessed.

def server_report(payload: dict) -> dict:
    """What one OpenAI-style chunk or body reports, whichever server sent it."""
    timings = payload.get("timings") if isinstance(payload.get("timings"), dict) else {}
    if "e2e_ms" in timings and "ttft_ms" in timings:  # another Latency Lab (it also speaks llama.cpp's names)
        return latency_lab_report(timings)
    report = llama_cpp_report(timings) if timings else {}
    if isinstance(payload.get("metrics"), dict):
        report.update(vllm_report(payload["metrics"]))
    return report


def latency_lab_report(t: dict) -> dict:
    """Our own `timings` (docs/api.md): glossary names already."""
    names = ("queue_ms", "ttft_ms", "prefill_ms", "decode_ms", "e2e_ms", "prompt_tokens", "cached_tokens",
             "prefill_tokens", "output_tokens", "drafted", "accepted")
    report = {k: t[k] for k in names if _num(t.get(k))}
    if "ttft_ms" in report:
        report["ttft_source"] = "ttft_ms"
    return {**report, "dialect": "latency-lab"}


def llama_cpp_report(t: dict) -> dict:
    """llama.cpp server's `timings` (tools/server/README.md in ggml-org/llama.cpp): prompt_n tokens
    prefilled in prompt_ms (up to the first token), predicted_n generated in predicted_ms, cache_n
    reused from the KV cache, draft_n / draft_n_accepted for speculative decoding. It reports no
    queue time, so its TTFT from receipt is unknown: prompt_ms stands in as a lower bound."""
    report = {}
    for ours, theirs in (("prefill_tokens", "prompt_n"), ("prefill_ms", "prompt_ms"), ("output_tokens", "predicted_n"),
                         ("decode_ms", "predicted_ms"), ("cached_tokens", "cache_n"), ("drafted", "draft_n"),
                         ("accepted", "draft_n_accepted")):
        if _num(t.get(theirs)):
            report[ours] = t[theirs]
    if "prefill_tokens" in report and "cached_tokens" in report:
        report["prompt_tokens"] = report["prefill_tokens"] + report["cached_tokens"]
    if "prefill_ms" in report:
        report["ttft_ms"], report["ttft_source"] = report["prefill_ms"], "prompt_ms"
    return {**report, "dialect": "llama.cpp"} if report else report


def vllm_report(m: dict) -> dict:
    """vLLM's per-request `metrics` (docs/features/per_request_metrics.md in vllm-project/vllm, with
    `--enable-per-request-metrics`): time_to_first_token_ms counts from *scheduling*, queue_time_ms
    apart, generation_time_ms is first → last token. Its TTFT from receipt is their sum."""
    report = {}
    if _num(m.get("queue_time_ms")):
        report["queue_ms"] = m["queue_time_ms"]
    if _num(m.get("generation_time_ms")):
        report["decode_ms"] = m["generation_time_ms"]
    ttft = m.get("time_to_first_token_ms")
    if _num(ttft):
        if "queue_ms" in report:
            report["ttft_ms"], report["ttft_source"] = report["queue_ms"] + ttft, "queue_time_ms+time_to_first_token_ms"
        else:  # queue unknown: a lower bound
            report["ttft_ms"], report["ttft_source"] = ttft, "time_to_first_token_ms"
    return {**report, "dialect": "vllm"} if report else report


def ollama_report(p: dict) -> dict:
    """Ollama's native final object (docs/api.md in ollama/ollama): durations in ns; prompt_eval_count
    counts the prompt tokens evaluated (a cached prefix is not evaluated, and not reported apart).
    Its TTFT is not reported: load_duration + prompt_eval_duration stands in as a lower bound."""
    ms = {k: p[k] / 1e6 for k in ("load_duration", "prompt_eval_duration", "eval_duration", "total_duration")
          if _num(p.get(k))}
    report = {}
    if _num(p.get("prompt_eval_count")):
        report["prefill_tokens"] = p["prompt_eval_count"]
    if _num(p.get("eval_count")):
        report["output_tokens"] = p["eval_count"]
    if "prompt_eval_duration" in ms:
        report["prefill_ms"] = ms["prompt_eval_duration"]
        report["ttft_ms"] = ms["prompt_eval_duration"] + ms.get("load_duration", 0.0)
        report["ttft_source"] = "load_duration+prompt_eval_duration"
    if "eval_duration" in ms:
        report["decode_ms"] = ms["eval_duration"]
    if "total_duration" in ms:
        report["e2e_ms"] = ms["total_duration"]
    return {**report, "dialect": "ollama"} if report else report


def tgi_headers(headers) -> dict:
    """TGI's timing headers (router/src/server.rs in huggingface/text-generation-inference: x-queue-time,
    x-inference-time, x-prompt-tokens, x-generated-tokens, in ms). TGI sets them on non-streamed
    answers; a streamed chat carries only `usage`, so for it these stay unknown."""
    report = {}
    for ours, name in (("queue_ms", "x-queue-time"), ("inference_ms", "x-inference-time"),
                       ("prompt_tokens", "x-prompt-tokens"), ("output_tokens", "x-generated-tokens")):
        raw = headers.get(name)
        if raw is not None:
            try:
                report[ours] = int(raw) if ours.endswith("tokens") else float(raw)
            except ValueError:
                pass
    return {**report, "dialect": "tgi"} if report else report


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def remote_counters(tl: Timeline) -> RemoteCounters:
    """The Timeline's `counters.remote`: made by the remote engine's submit, or here for a Timeline without one."""
    if tl.counters.remote is None:
        tl.counters.remote = RemoteCounters()
    return tl.counters.remote


def absorb(tl: Timeline, report: dict) -> None:
    """A server's report onto the Timeline: token counts where still unknown, the rest in counters.
    Another Latency Lab's own figures win over its vLLM-style `metrics` (which say less)."""
    if not report:
        return
    r = remote_counters(tl)
    if r.server_dialect == "latency-lab" and report.get("dialect") != "latency-lab":
        return
    r.server_dialect = report.get("dialect")
    for name in ("prompt_tokens", "cached_tokens", "prefill_tokens"):
        if name in report and getattr(tl, name) is None:
            setattr(tl, name, report[name])
    if tl.prefill_tokens is None and tl.prompt_tokens is not None and tl.cached_tokens is not None:
        tl.prefill_tokens = max(tl.prompt_tokens - tl.cached_tokens, 0)
    if "drafted" in report or "accepted" in report:
        spec = tl.counters.speculation = tl.counters.speculation or SpeculationCounters()
        spec.drafted = report.get("drafted", spec.drafted)
        spec.accepted = report.get("accepted", spec.accepted)
        if report.get("drafted"):
            spec.acceptance_rate = round(report.get("accepted", 0) / report["drafted"], 4)
    r.server_queue_ms = report.get("queue_ms", r.server_queue_ms)
    r.server_ttft_ms = report.get("ttft_ms", r.server_ttft_ms)
    r.server_prefill_ms = report.get("prefill_ms", r.server_prefill_ms)
    r.server_decode_ms = report.get("decode_ms", r.server_decode_ms)
    r.server_e2e_ms = report.get("e2e_ms", r.server_e2e_ms)
    r.server_inference_ms = report.get("inference_ms", r.server_inference_ms)
    r.server_output_tokens = report.get("output_tokens", r.server_output_tokens)
    r.server_ttft_source = report.get("ttft_source", r.server_ttft_source)


def apply_usage(tl: Timeline, usage: dict) -> None:
    """OpenAI `usage`. A server that omits prompt_tokens_details (SGLang without --enable-cache-report,
    llama-cpp-python) leaves cached_tokens unknown (None), not 0."""
    prompt = usage.get("prompt_tokens")
    if _num(prompt) and prompt > 0:  # no chat prompt has 0 tokens: a 0 means the server did not count
        tl.prompt_tokens = int(prompt)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if _num(cached):
        tl.cached_tokens = int(cached)
    if tl.prompt_tokens is not None and tl.cached_tokens is not None:
        tl.prefill_tokens = max(tl.prompt_tokens - tl.cached_tokens, 0)
    if _num(usage.get("completion_tokens")):
        remote_counters(tl).completion_tokens = usage["completion_tokens"]


def server_ttft(tl: Timeline) -> None:
    """The overhead between the server's first token and ours: client ttft − server ttft (from its receipt)."""
    r = remote_counters(tl)
    if _num(r.server_ttft_ms) and tl.ttft_ms is not None:
        r.transport_overhead_ms = tl.ttft_ms - float(r.server_ttft_ms)
