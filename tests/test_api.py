"""The OpenAI-compatible API, driven by the official openai SDK and raw HTTP on loopback:
timings and usage agree with what the client measured, errors are OpenAI-shaped 4xx, a client
that leaves cancels its generation, /metrics parses and moves."""

import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import ask, served

from engine.core.config import GenerationConfig
from engine.serving.decoding import Decoding
from engine.serving.service import Engine
from engine.serving.worker import Worker
from server.api import create_api
from server.run import BackgroundServer

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=8)
GLOSSARY = ("queue_ms", "setup_ms", "prefill_ms", "ttft_ms", "tpot_ms", "decode_tps", "e2e_ms", "itl_ms",
            "prompt_tokens", "prefill_tokens", "cached_tokens", "output_tokens")


def wait_final(handle, timeout=120.0):
    deadline = time.monotonic() + timeout
    while handle.final is None:
        assert time.monotonic() < deadline, "the request never finished"
        time.sleep(0.02)
    return handle.final


@pytest.fixture(scope="module")
def api(bundled_engine):
    with served(bundled_engine) as (url, rec, name):
        yield type("Api", (), {"url": url, "rec": rec, "model": name})


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(api, body, timeout=120.0, **kw):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(api.url + "/v1/chat/completions", content=content, timeout=timeout, **kw)


def test_models_lists_the_engine(client, api):
    models = client.models.list().data
    assert [m.id for m in models] == [api.model]
    assert client.models.retrieve(api.model).id == api.model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_streamed_reply_matches_the_engine_and_its_timings_fit_inside_the_clients(client, api, bundled_engine):
    messages = ask("Name a color.")
    direct = bundled_engine.complete(messages, GREEDY)
    t0 = time.perf_counter_ns()
    stream = client.chat.completions.create(model=api.model, messages=messages, max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    parts, first_ns, timings, usage, finish = [], None, None, None, None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content:
                first_ns = first_ns or time.perf_counter_ns()
                parts.append(delta.content)
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
                timings = chunk.model_extra["timings"]
        if chunk.usage:
            usage = chunk.usage
    end_ns = time.perf_counter_ns()

    assert "".join(parts) == direct.text and finish == direct.detail["finish_reason"]
    assert set(GLOSSARY) <= set(timings)
    # The server's intervals lie inside the client's: received after sent, sampled before arrival.
    assert 0 < timings["ttft_ms"] <= (first_ns - t0) / 1e6
    assert timings["ttft_ms"] <= timings["e2e_ms"] <= (end_ns - t0) / 1e6
    assert usage.completion_tokens == timings["output_tokens"] == direct.output_tokens
    assert usage.prompt_tokens == timings["prompt_tokens"] == direct.timeline.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == timings["cached_tokens"]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert len(timings["itl_ms"]) == timings["output_tokens"] - 1
    assert len(parts) <= timings["output_tokens"]


def test_non_streamed_reply_carries_usage_and_timings(client, api, bundled_engine):
    messages = ask("What is two plus two?")
    direct = bundled_engine.complete(messages, GREEDY)
    t0 = time.perf_counter_ns()
    reply = client.chat.completions.create(model=api.model, messages=messages, max_completion_tokens=8,
                                           temperature=0)
    client_ms = (time.perf_counter_ns() - t0) / 1e6
    timings = reply.model_extra["timings"]
    assert reply.choices[0].message.content == direct.text
    assert reply.choices[0].finish_reason == direct.detail["finish_reason"]
    assert reply.usage.completion_tokens == timings["output_tokens"] == direct.output_tokens
    assert reply.usage.prompt_tokens == direct.timeline.prompt_tokens
    assert 0 < timings["ttft_ms"] <= timings["e2e_ms"] <= client_ms


def test_extra_fields_reach_the_engine(client, api):
    session = httpx.post(api.url + "/v1/sessions").json()["id"]
    client.chat.completions.create(
        model=api.model, messages=[{"role": "developer", "content": "Be brief."},
                                   {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=3, temperature=0.5, top_p=0.8, seed=7, stop=["\n\n"],
        extra_body={"kv_reuse": False, "speculative": "off", "num_speculative_tokens": 3, "session": session,
                    "top_k": 20})
    req = api.rec.handles[-1].request
    assert req.session == "api:" + session[5:].split(".")[0] and req.messages[0] == {"role": "system", "content": "Be brief."}
    assert req.messages[1] == {"role": "user", "content": "Hi"}
    cfg = req.config
    assert (cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed, cfg.stop, cfg.kv_reuse,
            cfg.num_speculative_tokens, cfg.top_k) == (3, 0.5, 0.8, 7, ("\n\n",), False, 3, 20)
    assert api.rec.handles[-1].final.output_tokens <= 3


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, status, param, code", [
    (b"{not json", 400, None, "invalid_json"),
    (b"\xff\xfe", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_value"),
    ({"messages": []}, 400, "messages", "invalid_value"),
    ({"messages": "hi"}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages", "invalid_value"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "messages", "invalid_value"),
    ({"model": "gpt-17", "messages": HI}, 404, "model", "model_not_found"),
    ({"model": 5, "messages": HI}, 400, "model", "invalid_value"),
    ({"messages": HI, "temperature": -1}, 400, "temperature", "invalid_value"),
    ({"messages": HI, "temperature": "hot"}, 400, "temperature", "invalid_value"),
    ({"messages": HI, "top_p": 1.5}, 400, "top_p", "invalid_value"),
    ({"messages": HI, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"messages": HI, "max_completion_tokens": 2.5}, 400, "max_completion_tokens", "invalid_value"),
    ({"messages": HI, "seed": -1}, 400, "seed", "invalid_value"),
    ({"messages": HI, "stop": 7}, 400, "stop", "invalid_value"),
    ({"messages": HI, "stop": [""]}, 400, "stop", "invalid_value"),
    ({"messages": HI, "n": 2}, 400, "n", "invalid_value"),
    ({"messages": HI, "stream": "yes"}, 400, "stream", "invalid_value"),
    ({"messages": HI, "tools": [{"type": "function"}]}, 400, "tools", "invalid_value"),
    ({"messages": HI, "logprobs": True}, 400, "logprobs", "invalid_value"),
    ({"messages": HI, "kv_reuse": "yes"}, 400, "kv_reuse", "invalid_value"),
    ({"messages": HI, "speculative": "magic"}, 400, "speculative", "invalid_value"),
    ({"messages": HI, "session": ""}, 400, "session", "invalid_value"),
    ({"messages": HI, "compiled_decode": "yes"}, 400, "compiled_decode", "invalid_value"),
    ({"messages": HI, "compiled_decode": True, "speculative": "prompt_lookup"}, 400, "compiled_decode",
     "invalid_value"),
    ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "messages", "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "word " * 9000}], "stream": True}, 400, "messages",
     "context_length_exceeded"),
    ({"messages": HI, "max_tokens": 100000, "stream": True}, 400, "max_tokens", "context_length_exceeded"),
])
def test_bad_requests_get_openai_errors(api, body, status, param, code):
    resp = post(api, body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["code"] == code and err["message"]
    assert err["type"] == "invalid_request_error"


def test_the_sdk_raises_its_own_error_types_and_the_worker_keeps_serving(client, api):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=api.model, messages=HI, temperature=-3)
    assert exc.value.status_code == 400 and exc.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HI)
    ok = client.chat.completions.create(model=api.model, messages=HI, max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens > 0


def test_a_retired_variant_is_refused_naming_its_replacement_and_the_worker_keeps_serving(client, api):
    """int4w8a+head was retired (engine/quant/quantize.py RETIRED): a client that still names it gets a
    400 on `quantization` that says what to use instead, not a traceback."""
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=api.model, messages=HI, max_tokens=2,
                                       extra_body={"quantization": "int4w8a+head"})
    assert exc.value.status_code == 400 and exc.value.body["param"] == "quantization"
    message = exc.value.body["message"]
    assert "retired" in message and "'int4w8a+head8'" in message and "Traceback" not in message
    ok = client.chat.completions.create(model=api.model, messages=HI, max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens > 0


def test_unknown_paths_and_methods_are_openai_shaped(api):
    resp = httpx.get(api.url + "/v1/chat/completions")
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    resp = httpx.get(api.url + "/v1/nothing")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_body_size_is_limited(api):
    resp = post(api, b"{" + b" " * (3 * 1024 * 1024) + b"}")
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"


def test_disconnect_mid_stream_cancels_the_generation(api, bundled_engine):
    body = {"messages": ask("Write a very long story about a dragon."), "max_tokens": 400, "temperature": 0,
            "stream": True}
    before = len(api.rec.handles)
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", api.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            seen = 0
            for line in resp.iter_lines():
                if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                    seen += 1
                if seen == 3:
                    break  # leaving the block closes the connection mid-stream
    handle = api.rec.handles[before]
    final = wait_final(handle)
    assert final.detail["finish_reason"] == "cancelled"
    assert final.output_tokens < 40  # stopped within a few steps, far from the 400 asked for
    assert bundled_engine.complete(ask("Say hi."), GREEDY).output_tokens > 0  # the worker is free


def test_disconnect_while_queued_never_runs(api, bundled_engine):
    blocker = bundled_engine.submit(ask("Write a very long poem."), GenerationConfig(temperature=0.0,
                                                                                    max_new_tokens=400))
    before = len(api.rec.handles)
    try:
        with pytest.raises(httpx.ReadTimeout):  # no headers while it waits in line: the client gives up
            post(api, {"messages": HI, "max_tokens": 4, "stream": True}, timeout=httpx.Timeout(120, read=0.5))
        deadline = time.monotonic() + 60
        while not (len(api.rec.handles) > before and api.rec.handles[before].cancelled):
            assert time.monotonic() < deadline, "the server did not notice the client leaving"
            time.sleep(0.02)
    finally:
        blocker.cancel()
    final = wait_final(api.rec.handles[before])
    assert final.detail["finish_reason"] == "cancelled" and final.output_tokens == 0


def scrape(api) -> dict:
    """{(sample name, labels): value} from /metrics, through prometheus_client's own parser."""
    resp = httpx.get(api.url + "/metrics")
    assert resp.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def test_metrics_parse_and_move_with_a_request(client, api):
    before = scrape(api)
    reply = client.chat.completions.create(model=api.model, messages=ask("Name a fruit."), max_tokens=6,
                                           temperature=0)
    after = scrape(api)
    m = (("engine", "0"), ("model_name", api.model))

    def delta(name, labels=m):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    out = reply.usage.completion_tokens
    assert delta("latency_lab:time_to_first_token_seconds_count") == 1
    assert delta("latency_lab:e2e_request_latency_seconds_count") == 1
    assert delta("latency_lab:request_queue_time_seconds_count") == 1
    assert delta("latency_lab:inter_token_latency_seconds_count") == out - 1
    assert delta("latency_lab:generation_tokens_total") == out
    assert delta("latency_lab:prompt_tokens_total") == reply.usage.prompt_tokens
    assert delta("latency_lab:prefix_cache_queries_total") == reply.usage.prompt_tokens
    assert delta("latency_lab:prefix_cache_hits_total") == reply.usage.prompt_tokens_details.cached_tokens
    finished = (("engine", "0"), ("finished_reason", reply.choices[0].finish_reason), ("model_name", api.model))
    assert delta("latency_lab:request_success_total", finished) == 1
    ttft_s = reply.model_extra["timings"]["ttft_ms"] / 1e3
    assert delta("latency_lab:time_to_first_token_seconds_sum") == pytest.approx(ttft_s)
    assert ("latency_lab:num_requests_waiting", m) in after
    assert ("latency_lab:spec_decode_num_draft_tokens_total", m) in after


def test_api_key_is_required_when_set(bundled_engine):
    with BackgroundServer(create_api(bundled_engine, api_key="s3cret")) as url:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            resp = httpx.post(url + "/v1/chat/completions", json={"messages": HI}, headers=headers)
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model=bundled_engine.info().name, messages=HI, max_tokens=2,
                                            temperature=0).usage.completion_tokens > 0
        assert httpx.get(url + "/metrics").status_code == 200  # like vLLM: /metrics and /health stay open


def test_a_full_queue_is_429(bundled):
    full = Engine(bundled, max_queue=0)  # refuses everything: nothing ever runs on this worker
    try:
        with BackgroundServer(create_api(full)) as url:
            resp = httpx.post(url + "/v1/chat/completions", json={"messages": HI})
            assert resp.status_code == 429 and resp.json()["error"]["type"] == "rate_limit_error"
    finally:
        full.close()


def test_an_engine_failure_mid_stream_is_reported_in_the_stream(bundled):
    class Exploding(Decoding):
        def step(self):
            raise RuntimeError("forced failure")

    broken = Engine(bundled)
    broken.worker.close()
    broken.worker = Worker(bundled, decoding_factory=Exploding)
    try:
        with BackgroundServer(create_api(broken)) as url:
            sdk = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.APIError, match="forced failure"):
                for _ in sdk.chat.completions.create(model=broken.info().name, messages=HI, max_tokens=5,
                                                     temperature=0, stream=True):
                    pass
            resp = httpx.post(url + "/v1/chat/completions", json={"messages": HI, "max_tokens": 5})
            assert resp.status_code == 500 and resp.json()["error"]["type"] == "server_error"
    finally:
        broken.close()


LLAMA_CPP_TIMINGS = ("prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
                     "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "cache_n", "draft_n",
                     "draft_n_accepted")
VLLM_METRICS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second")


def test_llama_cpp_and_vllm_clients_read_our_timings(client, api):
    """A plain llama.cpp-style client (raw SSE, `timings` on the finish chunk, as llama.cpp's own web UI
    reads it) and the openai SDK (`model_extra`) both find llama.cpp's names and vLLM's `metrics`."""
    body = {"model": api.model, "messages": ask("Name a planet."), "max_tokens": 6, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    timings = usage_metrics = None
    with httpx.stream("POST", api.url + "/v1/chat/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            timings = payload.get("timings") or timings
            if payload.get("usage"):
                usage, usage_metrics = payload["usage"], payload["metrics"]
    assert set(LLAMA_CPP_TIMINGS) <= set(timings)
    assert timings["prompt_n"] == timings["prefill_tokens"] and timings["cache_n"] == timings["cached_tokens"]
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
    assert timings["predicted_n"] == timings["output_tokens"] == usage["completion_tokens"]
    assert timings["prompt_ms"] == pytest.approx(timings["prefill_ms"])
    assert timings["predicted_ms"] == pytest.approx(timings["decode_ms"])
    assert timings["predicted_per_second"] == pytest.approx(timings["predicted_n"] / timings["predicted_ms"] * 1e3)
    assert timings["draft_n"] is None and timings["draft_n_accepted"] is None  # no speculation ran: unknown, not 0
    # vLLM's TTFT starts at scheduling: ours minus the queue and setup before the worker took it
    assert set(VLLM_METRICS) <= set(usage_metrics)
    assert usage_metrics["queue_time_ms"] == pytest.approx(timings["queue_ms"])
    assert 0 < usage_metrics["time_to_first_token_ms"] <= timings["ttft_ms"]

    reply = client.chat.completions.create(model=api.model, messages=ask("Name a planet."), max_tokens=6,
                                           temperature=0)
    sdk_timings, sdk_metrics = reply.model_extra["timings"], reply.model_extra["metrics"]
    assert set(LLAMA_CPP_TIMINGS) <= set(sdk_timings) and set(VLLM_METRICS) <= set(sdk_metrics)
    assert sdk_timings["predicted_n"] == reply.usage.completion_tokens
    assert sdk_metrics["generation_time_ms"] == pytest.approx(sdk_timings["decode_ms"])
