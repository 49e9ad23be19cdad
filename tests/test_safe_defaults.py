"""Safe defaults: loopback and no public link unless asked, the CLI's defaults, per-session prefix
caches whose ids cannot be chosen, model paths from the command line only, request size limits,
and a remote engine that never sees our session strings."""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from support import ask, public_preamble

from engine.core.config import GenerationConfig, LoadConfig
from engine.core.errors import InvalidRequest
from engine.serving.prefix_cache import PrefixCache
from server.api import create_api
from server.run import BackgroundServer

GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=6)


# --- safe defaults ------------------------------------------------------------------------------
def test_app_binds_loopback_and_opens_no_public_link_unless_asked(monkeypatch):
    """`python app.py` as a user runs it (a paced source stands in for the model)."""
    import uvicorn

    import app

    served, shared = [], []
    monkeypatch.setattr(uvicorn, "run", lambda a, **kw: served.append((a, kw)))
    monkeypatch.setattr(app, "_share", lambda host, port: shared.append((host, port)))
    assert app.main(["--paced-source", "500"]) == 0
    assert served[-1][1]["host"] == "127.0.0.1" and shared == []
    assert app.main(["--paced-source", "500", "--share"]) == 0 and shared == [("127.0.0.1", 7860)]
    assert app.main(["--paced-source", "500", "--api-key", "k"]) == 0
    from fastapi.testclient import TestClient

    with TestClient(served[-1][0]) as client:  # the API key guards /v1 of the whole app
        assert client.post("/v1/chat/completions", json={"messages": ask("hi")}).status_code == 401
        assert client.post("/v1/sessions").status_code == 401
        assert client.post("/v1/sessions", headers={"Authorization": "Bearer k"}).status_code == 200


def test_cli_defaults_are_safe():
    import argparse

    import app
    from server.cli import add_server_args

    args = app.build_parser().parse_args([])
    assert (args.host, args.share) == ("127.0.0.1", False)
    assert args.max_queue is not None and args.max_queue > 0 and not args.shared_prefix_cache
    p = argparse.ArgumentParser()
    add_server_args(p)
    assert p.parse_args([]).host == "127.0.0.1"
    assert LoadConfig().shared_prefix_cache is False and PrefixCache().shared is False


@pytest.fixture(scope="module")
def served(bundled_engine):
    with BackgroundServer(create_api(bundled_engine)) as url:
        yield url


def chat(url, session, text="Tell me about the sea in one sentence.", **extra):
    body = {"messages": ask(text), "max_tokens": 4, "temperature": 0, **extra}
    if session is not None:
        body["session"] = session
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_the_prefix_cache_is_per_session_and_sessions_cannot_be_chosen(served, bundled_engine):
    a, b = (httpx.post(served + "/v1/sessions").json()["id"] for _ in range(2))
    assert a != b and len(a) > 40
    public = public_preamble(bundled_engine)  # the template's preamble: the same for everyone, served to all
    first = chat(served, a).json()
    again = chat(served, a).json()
    other = chat(served, b).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == public
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > public  # same session: its own prefix
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == public  # another session: none of a's
    no_session = chat(served, None).json()
    assert no_session["usage"]["prompt_tokens_details"]["cached_tokens"] == public
    # A session the server did not issue is refused: guessed, forged, another run's, or the engine's own name.
    nonce = a[len("sess_"):].split(".")[0]
    for guess in ("demo", "tab-1", "sess_" + nonce, f"sess_{nonce}.AAAAAAAAAAAAAAAAAAAAAA", "api:" + nonce,
                  a[:-1] + ("A" if a[-1] != "A" else "B")):
        resp = chat(served, guess)
        err = resp.json()["error"]
        assert resp.status_code == 400 and err["param"] == "session" and "POST /v1/sessions" in err["message"]


def test_model_paths_come_only_from_the_command_line(served, bundled_engine, tmp_path):
    """A request that names a file — as the model, a variant, a draft, anything — never makes the
    server open it: it is refused, or ignored and served by the model loaded at start."""
    model_file = tmp_path / "evil-model.gguf"
    model_file.write_bytes(b"GGUF")
    folder = tmp_path / "evil-folder"
    folder.mkdir()
    touched = []

    def audit(event, args):
        if event in ("open", "os.listdir", "os.scandir") and args and str(tmp_path) in str(args[0]):
            touched.append((event, str(args[0])))

    sys.addaudithook(audit)  # hooks cannot be removed; this one only notes paths under tmp_path
    name = bundled_engine.info().name
    paths = [str(model_file), str(folder), f"file://{model_file}", f"../../{model_file}"]
    for path in paths:
        resp = chat(served, None, model=path)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
        for fields in ({"quantization": path}, {f: path for f in ("draft_model", "model_path", "gguf_file",
                                                                 "speculative_model", "tokenizer", "path")}):
            resp = chat(served, None, **fields)
            assert resp.status_code in (200, 400), resp.text  # refused, or ignored:
            if resp.status_code == 200:
                assert resp.json()["model"] == name  # served by the model loaded at start
    # The page: a setting naming a path is refused, and backends are only those built at start.
    from ui.chat.store import ChatStore
    from ui.chat.settings import PaneSettings

    for setting in ("model", "model_path", "draft_model"):
        with pytest.raises(InvalidRequest, match="unknown setting"):
            PaneSettings.read({setting: str(model_file)})
    with pytest.raises(InvalidRequest, match="backend must be one of"):
        ChatStore({name: bundled_engine}).engine(str(model_file))
    assert touched == []
    assert bundled_engine.info().name == name and bundled_engine.info().path != str(model_file)


def test_request_size_is_limited_on_every_route_of_the_app(bundled_engine):
    from ui.webapp import create_app

    api = create_api(bundled_engine)
    big = b'{"session": "x", "message": "' + b"a" * (3 * 2**20) + b'"}'
    with BackgroundServer(create_app(api.state.backends, app=api)) as url:
        for path in ("/v1/chat/completions", "/lab/chat", "/lab/turn", "/gradio_api/queue/join"):
            resp = httpx.post(url + path, content=big, headers={"Content-Type": "application/json"}, timeout=60)
            assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large", path
        assert httpx.post(url + "/lab/session").status_code == 200  # and the app is still up


def test_a_remote_engine_never_sends_our_session_strings(served, bundled_engine):
    """The page's session ids are secrets of this machine: a remote Latency Lab gets ids it issued
    itself (one per session of ours, so KV reuse still works there); other servers get none."""
    from engine.remote.client import RemoteEngine

    public = public_preamble(bundled_engine)
    remote = RemoteEngine(served + "/v1", bundled_engine.info().name)
    try:
        text = "Tell me about the moon in one sentence."
        first = remote.complete(ask(text), GREEDY, session="page-secret/chat")
        again = remote.complete(ask(text), GREEDY, session="page-secret/chat")
        other = remote.complete(ask(text), GREEDY, session="another-tab/chat")
    finally:
        remote.close()
    assert (first.timeline.cached_tokens, other.timeline.cached_tokens) == (public, public)
    assert again.timeline.cached_tokens > public and again.text == first.text

    bodies = []
    fake = FastAPI()

    @fake.post("/v1/chat/completions")
    async def chat(request: Request):
        bodies.append(await request.json())

        async def stream():
            yield 'data: {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}\n\n'
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    with BackgroundServer(fake) as url:
        other_server = RemoteEngine(url + "/v1", "m")
        try:
            for _ in range(2):
                assert other_server.complete(ask("hi"), GREEDY, session="page-secret/chat").text == "ok"
        finally:
            other_server.close()
    assert len(bodies) == 2 and all("session" not in b for b in bodies)
    assert "page-secret" not in json.dumps(bodies)


def test_a_client_that_leaves_before_its_body_is_sent_is_no_server_error(served):
    import socket
    from urllib.parse import urlparse

    from prometheus_client.parser import text_string_to_metric_families

    def errors():
        text = httpx.get(served + "/metrics").text
        return {s.labels["status"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "latency_lab:api_errors_total"}

    before = errors()
    u = urlparse(served)
    with socket.create_connection((u.hostname, u.port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"messages\": [")
        time.sleep(0.3)  # the handler is waiting for the rest of the body
    deadline = time.monotonic() + 30
    while errors().get("499", 0) == before.get("499", 0):
        assert time.monotonic() < deadline, errors()
        time.sleep(0.05)
    after = errors()
    five = {k: v for k, v in after.items() if k.startswith("5")}
    assert five == {k: v for k, v in before.items() if k.startswith("5")}
