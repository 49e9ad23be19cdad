"""The remote engine: an OpenAI-compatible server measured from the client side, pointed at our own
API on loopback (same text as the engine in-process), at fakes shaped like llama.cpp and Ollama
(their timings and error bodies), and at nothing (a clear error)."""

import argparse
import asyncio
import contextlib
import io
import json
import socket
import time

import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from support import ask, cancel_once_streaming, served

from engine.core.config import GenerationConfig
from engine.core.errors import InvalidRequest
from engine.remote.client import RemoteEngine
from engine.remote.wire import RemoteError
from server.api import create_api
from server.cli import add_server_args, build_backends
from server.run import BackgroundServer

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def ours(bundled_engine):
    """Our API over the bundled engine, on a free loopback port."""
    with served(bundled_engine) as (url, rec, name):
        yield type("Ours", (), {"url": url, "base_url": url + "/v1", "rec": rec, "model": name})


@pytest.fixture(scope="module")
def remote(ours):
    engine = RemoteEngine(ours.base_url, ours.model)
    yield engine
    engine.close()


def test_remote_reproduces_the_local_text_and_measures_from_the_client(remote, bundled_engine):
    messages = ask("Name a color.")
    local = bundled_engine.complete(messages, GREEDY)
    done = remote.complete(messages, GREEDY)
    tl, c = done.timeline, done.timeline.counters
    assert done.text == local.text and done.detail["finish_reason"] == local.detail["finish_reason"]
    server = c.remote.server_timings
    assert server["output_tokens"] == local.output_tokens == c.remote.completion_tokens
    assert tl.prompt_tokens == local.timeline.prompt_tokens
    # The client's interval contains the server's: its ttft can only be longer.
    assert c.remote.server_ttft_source == "ttft_ms"
    assert 0 < c.remote.server_ttft_ms <= tl.ttft_ms
    assert c.remote.transport_overhead_ms == pytest.approx(tl.ttft_ms - c.remote.server_ttft_ms)
    assert server["e2e_ms"] <= tl.e2e_ms
    assert 0 < c.remote.chunks == tl.output_tokens <= local.output_tokens
    assert c.remote.measured_at == "client"


def test_async_events_give_the_same_stream(remote, bundled_engine):
    messages = ask("What is the capital of France?")

    async def consume():
        handle = remote.submit(messages, GREEDY)
        return [e async for e in handle.aevents()]

    events = asyncio.run(consume())
    kinds = [e.kind for e in events]
    assert kinds[0] == "status" and kinds[-1] == "done" and "chunk" in kinds
    text = "".join(e.text for e in events if e.kind == "chunk")
    assert text == events[-1].text == bundled_engine.complete(messages, GREEDY).text
    tl = events[-1].timeline
    assert len(tl.chunk_out_ns) == kinds.count("chunk")  # each chunk's hand-off is stamped


def test_cancelling_a_remote_request_cancels_it_on_the_server(remote, ours, bundled_engine):
    before = len(ours.rec.handles)
    handle = remote.submit(ask("Write a very long story about a dragon."),
                           GenerationConfig(temperature=0.0, max_new_tokens=400))
    cancel_once_streaming(handle)
    assert handle.final.detail["finish_reason"] == "cancelled"
    server_side = ours.rec.handles[before]
    deadline = time.monotonic() + 60
    while server_side.final is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert server_side.final.detail["finish_reason"] == "cancelled"
    assert server_side.final.output_tokens < 40
    assert remote.complete(ask("Say hi."), GREEDY).text  # both sides keep serving
    assert remote.in_flight() == 0


def test_server_errors_come_back_as_remote_errors(ours, remote):
    wrong = RemoteEngine(ours.base_url, "no-such-model")
    try:
        with pytest.raises(RemoteError) as exc:
            wrong.complete(ask("hi"), GREEDY)
        assert exc.value.status == 404 and exc.value.code == "model_not_found" and "no-such-model" in str(exc.value)
    finally:
        wrong.close()
    with pytest.raises(RemoteError) as exc:
        remote.complete(ask("word " * 9000), GREEDY)
    assert exc.value.status == 400 and exc.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest):  # checked here, before anything is sent
        remote.submit(ask("hi"), GenerationConfig(temperature=-1.0))
    with pytest.raises(InvalidRequest):
        remote.complete([{"role": "wizard", "content": "hi"}], GREEDY)


def test_an_unreachable_server_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    engine = RemoteEngine(f"http://127.0.0.1:{port}/v1", "m")
    try:
        with pytest.raises(RemoteError, match="could not talk to"):
            engine.complete(ask("hi"), GREEDY)
    finally:
        engine.close()


def fake_server(chunks: list, status: int = 200, error_body=None) -> FastAPI:
    """A stand-in for another serving stack: replays fixed SSE payloads (or an error body)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        if status != 200:
            return JSONResponse(error_body, status_code=status)

        async def body():
            for payload in chunks:
                yield f"data: {json.dumps(payload)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def test_llama_cpp_timings_are_kept_as_server_timings():
    def delta(text, finish=None, **extra):
        return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}], **extra}

    llama_timings = {"prompt_n": 12, "prompt_ms": 20.5, "predicted_n": 3, "predicted_ms": 30.0}
    chunks = [delta("Hello"), delta(","), delta(" world", "stop", timings=llama_timings),
              {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                                        "prompt_tokens_details": {"cached_tokens": 4}}}]
    with BackgroundServer(fake_server(chunks)) as url:
        engine = RemoteEngine(url + "/v1", "llama")
        try:
            done = engine.complete(ask("hi"), GREEDY)
        finally:
            engine.close()
    tl, c = done.timeline, done.timeline.counters
    assert done.text == "Hello, world" and tl.finish_reason == "stop"
    assert c.remote.server_timings == llama_timings
    assert c.remote.server_ttft_source == "prompt_ms" and c.remote.server_ttft_ms == 20.5
    assert (tl.prompt_tokens, tl.cached_tokens, tl.prefill_tokens, c.remote.completion_tokens) == (12, 4, 8, 3)
    assert tl.output_tokens == 3 and len(tl.itl_ms) == 2


def test_ollama_style_error_bodies_are_read():
    app = fake_server([], status=404, error_body={"error": "model 'llama9' not found"})
    with BackgroundServer(app) as url:
        engine = RemoteEngine(url + "/v1", "llama9")
        try:
            with pytest.raises(RemoteError, match="model 'llama9' not found") as exc:
                engine.complete(ask("hi"), GREEDY)
        finally:
            engine.close()
    assert exc.value.status == 404


def test_our_api_can_serve_a_remote_engine(ours, bundled_engine):
    """--backend openai: the API proxies a remote server and reports client-side timings of it."""
    proxied = RemoteEngine(ours.base_url, ours.model)
    try:
        with BackgroundServer(create_api({"far": proxied})) as url:
            sdk = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            reply = sdk.chat.completions.create(model="far", messages=ask("Name a fruit."), max_tokens=8,
                                                temperature=0)
            with pytest.raises(openai.BadRequestError):  # the far server's 400 passes through as a 400
                sdk.chat.completions.create(model="far", messages=ask("word " * 9000), max_tokens=8)
    finally:
        proxied.close()
    assert reply.choices[0].message.content == bundled_engine.complete(ask("Name a fruit."), GREEDY).text
    timings = reply.model_extra["timings"]
    assert timings["server_timings"]["ttft_ms"] <= timings["ttft_ms"]


def test_the_remote_bench_scenario_prints_client_and_server_figures(ours):
    from server.bench import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["remote", "--base-url", ours.base_url, "--remote-model", ours.model, "--runs", "2",
              "--prompts", "1", "--max-new-tokens", "4", "--json"])
    result = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert result["requests"] == 2 and result["identical"] is True
    assert result["client_ttft_ms_p50"] >= result["server_ttft_ms_p50"] > 0
    assert result["ratio"] >= 1.0


def test_server_flags_name_the_backends(bundled_engine):
    p = argparse.ArgumentParser()
    add_server_args(p)
    args = p.parse_args([])
    assert args.host == "127.0.0.1" and args.backend == "local"
    assert list(build_backends(args, lambda: bundled_engine)) == [bundled_engine.info().name]
    with pytest.raises(InvalidRequest, match="--base-url"):
        build_backends(p.parse_args(["--backend", "openai"]), lambda: bundled_engine)
    args = p.parse_args(["--backend", "both", "--base-url", "http://127.0.0.1:9/v1",
                         "--remote-model", bundled_engine.info().name])
    backends = build_backends(args, lambda: bundled_engine)
    try:
        assert list(backends) == [bundled_engine.info().name, f"remote/{bundled_engine.info().name}"]
        assert isinstance(backends[f"remote/{bundled_engine.info().name}"], RemoteEngine)
    finally:
        backends[f"remote/{bundled_engine.info().name}"].close()
