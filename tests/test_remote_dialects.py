"""The remote engine maps what each known server reports onto our Timeline, and leaves the rest
unknown (None, never 0). Each test replays a recorded response in that server's documented format;
the comment above it names where the format is documented. No model is loaded."""

import json

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from support import ask

from engine.core.config import GenerationConfig
from engine.remote.client import RemoteEngine
from server.run import BackgroundServer

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=8)


def delta(text, finish=None, **extra):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}], **extra}


def sse_server(chunks: list, headers: dict | None = None) -> FastAPI:
    """Replays fixed OpenAI-style SSE payloads; /api/version is absent (not Ollama)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        async def body():
            for payload in chunks:
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers=headers or {})

    return app


def run(app: FastAPI, **engine_kw):
    with BackgroundServer(app) as url:
        engine = RemoteEngine(url + "/v1", "m", **engine_kw)
        try:
            done = engine.complete(ask("hi"), GREEDY)
            return done, engine.info()
        finally:
            engine.close()


def test_vllm_per_request_metrics_keep_its_queue_out_of_the_transport_overhead():
    # vLLM docs/features/per_request_metrics.md (vllm-project/vllm, `--enable-per-request-metrics`):
    # streamed, `metrics` rides on the final usage chunk; TTFT counts from scheduling.
    metrics = {"time_to_first_token_ms": 85.2, "generation_time_ms": 1240.5, "queue_time_ms": 12.3,
               "mean_itl_ms": 9.1, "tokens_per_second": 103.2}
    chunks = [delta("Hel"), delta("lo", "stop"),
              {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
               "usage": {"prompt_tokens": 42, "completion_tokens": 2, "total_tokens": 44}, "metrics": metrics}]
    done, _ = run(sse_server(chunks))
    tl, c = done.timeline, done.timeline.counters
    assert done.text == "Hello"
    assert c.remote.server_queue_ms == 12.3 and c.remote.server_decode_ms == 1240.5
    assert c.remote.server_ttft_ms == pytest.approx(12.3 + 85.2)
    assert c.remote.server_ttft_source == "queue_time_ms+time_to_first_token_ms"
    assert c.remote.transport_overhead_ms == pytest.approx(tl.ttft_ms - (12.3 + 85.2))
    # vLLM's usage has no prompt_tokens_details unless asked: cached is unknown, not 0
    assert (tl.prompt_tokens, tl.cached_tokens, tl.prefill_tokens) == (42, None, None)


def test_llama_cpp_server_timings_cache_and_drafts():
    # llama.cpp tools/server/README.md (ggml-org/llama.cpp): `timings` on the last streamed chunk,
    # cache_n = prompt tokens reused from the cache, draft_n / draft_n_accepted with speculation.
    timings = {"cache_n": 60, "prompt_n": 8, "prompt_ms": 43.237, "prompt_per_token_ms": 5.404625,
               "prompt_per_second": 185.03, "predicted_n": 3, "predicted_ms": 23.8,
               "predicted_per_token_ms": 7.93, "predicted_per_second": 126.0, "draft_n": 4, "draft_n_accepted": 3}
    chunks = [delta("a"), delta("b"), delta("c", "stop", timings=timings)]
    done, _ = run(sse_server(chunks))
    tl, c = done.timeline, done.timeline.counters
    assert (tl.prompt_tokens, tl.cached_tokens, tl.prefill_tokens) == (68, 60, 8)
    assert (c.speculation.drafted, c.speculation.accepted, c.speculation.acceptance_rate) == (4, 3, 0.75)
    assert c.remote.server_prefill_ms == 43.237 and c.remote.server_decode_ms == 23.8
    assert c.remote.server_ttft_source == "prompt_ms"  # no queue reported: a lower bound
    assert c.remote.server_timings == timings


def test_llama_cpp_python_without_usage_leaves_tokens_unknown():
    # llama-cpp-python's OpenAI server (abetlen/llama-cpp-python, llama_cpp/server): streamed chunks
    # carry no usage and no timings.
    done, _ = run(sse_server([delta("x"), delta("y", "stop")]))
    tl = done.timeline
    assert (tl.prompt_tokens, tl.cached_tokens, tl.prefill_tokens) == (None, None, None)
    assert tl.counters.remote.transport_overhead_ms is None and tl.counters.speculation is None
    assert tl.llama_cpp_timings()["cache_n"] is None and tl.llama_cpp_timings()["prompt_n"] is None


@pytest.mark.parametrize("details, cached", [(None, None), ({"cached_tokens": 30}, 30)])
def test_sglang_usage_reports_cached_tokens_only_when_enabled(details, cached):
    # SGLang server arguments (docs.sglang.io, "enable_cache_report: Return number of cached tokens in
    # usage.prompt_tokens_details"); without it prompt_tokens_details is null. Its chunks carry
    # `metadata.weight_version`.
    usage = {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51, "prompt_tokens_details": details}
    chunks = [delta("z", "stop", metadata={"weight_version": "default"}),
              {"id": "1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
               "usage": usage}]
    tl = run(sse_server(chunks))[0].timeline
    assert (tl.prompt_tokens, tl.cached_tokens) == (50, cached)
    assert tl.prefill_tokens == (None if cached is None else 20)


def test_tgi_timing_headers_are_mapped_when_present():
    # TGI router/src/server.rs (huggingface/text-generation-inference): x-queue-time, x-inference-time
    # (ms), x-prompt-tokens, x-generated-tokens headers; its streamed chat ends with `usage`.
    headers = {"x-queue-time": "7", "x-inference-time": "120", "x-prompt-tokens": "21", "x-generated-tokens": "2"}
    chunks = [delta("o"), delta("k", "stop", system_fingerprint="3.3.6-native"),
              {"id": "", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
               "usage": {"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23}}]
    tl = run(sse_server(chunks, headers))[0].timeline
    c = tl.counters
    assert (c.remote.server_queue_ms, c.remote.server_inference_ms) == (7.0, 120.0)
    assert tl.prompt_tokens == 21 and tl.cached_tokens is None
    assert c.remote.server_ttft_ms is None and c.remote.transport_overhead_ms is None  # TGI reports no TTFT


def ollama_server(lines: list) -> FastAPI:
    app = FastAPI()
    app.state.bodies = []

    @app.get("/api/version")
    async def version():
        return {"version": "0.12.0"}

    @app.post("/api/chat")
    async def chat(body: dict):
        app.state.bodies.append(body)

        async def stream():
            for line in lines:
                yield json.dumps(line) + "\n"

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.post("/v1/chat/completions")
    async def openai_chat():
        return JSONResponse({"error": "the test expects the native API"}, status_code=500)

    return app


def test_ollama_native_api_is_used_and_its_durations_mapped():
    # Ollama docs/api.md (ollama/ollama), "Generate a chat completion": NDJSON, the final object has
    # done: true, total_duration, load_duration, prompt_eval_count, prompt_eval_duration, eval_count,
    # eval_duration (nanoseconds).
    lines = [{"model": "m", "created_at": "2026-12-01T00:00:00Z", "message": {"role": "assistant", "content": "Hi"},
              "done": False},
             {"model": "m", "created_at": "2026-12-01T00:00:00Z", "message": {"role": "assistant", "content": "!"},
              "done": False},
             {"model": "m", "created_at": "2026-12-01T00:00:00Z", "message": {"role": "assistant", "content": ""},
              "done": True, "done_reason": "stop", "total_duration": 5_000_000_000, "load_duration": 1_000_000,
              "prompt_eval_count": 26, "prompt_eval_duration": 130_000_000, "eval_count": 2,
              "eval_duration": 40_000_000}]
    app = ollama_server(lines)
    done, info = run(app)
    tl, c = done.timeline, done.timeline.counters
    assert info.extra["dialect"] == "ollama" and done.text == "Hi!" and tl.finish_reason == "stop"
    assert app.state.bodies[0]["options"]["num_predict"] == GREEDY.max_new_tokens
    assert tl.prefill_tokens == 26 and tl.prompt_tokens is None and tl.cached_tokens is None
    assert c.remote.server_prefill_ms == 130.0 and c.remote.server_decode_ms == 40.0 and c.remote.server_e2e_ms == 5000.0
    assert c.remote.server_ttft_ms == pytest.approx(131.0)
    assert c.remote.server_timings["eval_count"] == 2


def test_the_openai_dialect_skips_the_ollama_probe():
    app = ollama_server([])
    with BackgroundServer(app) as url:
        engine = RemoteEngine(url + "/v1", "m", dialect="openai")
        try:
            from engine.remote.wire import RemoteError

            with pytest.raises(RemoteError, match="native API"):
                engine.complete(ask("hi"), GREEDY)
        finally:
            engine.close()


# --- thinking vs answering: each server's way of sending a thought (engine/core/thinking.py) ------------
def reasoning_delta(text, field):
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": None, field: text}, "finish_reason": None}]}


def assert_thought(done, first: int, end: int, answer: int, source: str, text: str):
    """The reply's text keeps the thought, marked; its instants are the arrivals of chunks first/end/answer."""
    tl = done.timeline
    assert done.text == text
    assert tl.thought_first_ns == tl.token_ns[first]
    assert tl.thought_end_ns == tl.token_ns[end] and tl.thought_tokens == end + 1
    assert tl.answer_first_ns == tl.token_ns[answer]
    assert tl.counters.thought_source == source
    assert tl.ttft_ms <= tl.ttft_thought_ms <= tl.ttfa_ms


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_vllm_reasoning_deltas_are_kept_as_a_marked_thought(field):
    # vLLM docs/features/reasoning_outputs.md (vllm-project/vllm, `--reasoning-parser`): the thought streams
    # in `delta.reasoning` (named `reasoning_content` before 0.11), the answer in `delta.content`.
    chunks = [reasoning_delta("The user", field), reasoning_delta(" asks.", field), delta("\n\n"), delta("Hi"),
              delta("!", "stop")]
    done, _ = run(sse_server(chunks))
    assert_thought(done, first=0, end=2, answer=3, source=field,
                   text="<think>The user asks.</think>\n\nHi!")


def test_llama_cpp_reasoning_content_with_its_timings():
    # llama.cpp tools/server/README.md (`--reasoning-format deepseek`): `delta.reasoning_content`, the
    # answer in `content`, `timings` on the last chunk (predicted_n counts the thought's tokens too).
    timings = {"cache_n": 0, "prompt_n": 9, "prompt_ms": 40.0, "predicted_n": 4, "predicted_ms": 30.0}
    chunks = [reasoning_delta("Hmm", "reasoning_content"), reasoning_delta(".", "reasoning_content"),
              delta("Yes"), delta(".", "stop", timings=timings)]
    done, _ = run(sse_server(chunks))
    assert_thought(done, first=0, end=2, answer=2, source="reasoning_content", text="<think>Hmm.</think>Yes.")
    assert done.timeline.counters.remote.server_output_tokens == 4


def test_llama_cpp_without_a_reasoning_format_streams_the_tags_in_its_text():
    # llama.cpp with `--reasoning-format none` (and older builds, ggml-org/llama.cpp#13867): the thought
    # arrives inside `content`, tags and all, the closing tag cut between two chunks here.
    chunks = [delta("<think>"), delta("\n"), delta("Hmm"), delta(".</thi"), delta("nk>\n\n"), delta("Yes", "stop")]
    done, _ = run(sse_server(chunks))
    assert_thought(done, first=2, end=4, answer=5, source="text", text="<think>\nHmm.</think>\n\nYes")


def test_ollama_thinking_field():
    # Ollama docs/api.md (ollama/ollama), "Generate a chat completion" with a thinking model:
    # `message.thinking` carries the thought, `message.content` the answer.
    def line(content="", thinking=None, **extra):
        message = {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {})}
        return {"model": "m", "created_at": "2026-12-01T00:00:00Z", "message": message, "done": False, **extra}

    lines = [line(thinking="Short"), line(thinking=" question."), line("Yes"), line("."),
             {**line(), "done": True, "done_reason": "stop", "eval_count": 4, "eval_duration": 40_000_000}]
    done, _ = run(ollama_server(lines))
    assert_thought(done, first=0, end=2, answer=2, source="thinking", text="<think>Short question.</think>Yes.")
