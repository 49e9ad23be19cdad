"""The page's /lab endpoints over HTTP: the SSE token stream, stop, clear, clock, timings, exports.
Bad input gets a 4xx with a message, never a 500. Uses the paced test source (no model)."""

import csv
import io
import json
import re
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ui.chat.store import ChatStore
from ui.chat.paced import PacedSource
from ui.shell.presets import load_prompt_sets, teaching_presets
from ui.chat.routes import lab_router


@pytest.fixture(scope="module")
def client():
    source = PacedSource(tokens_per_s=1000, prefill_ms=1)
    app = FastAPI()
    app.include_router(lab_router(ChatStore(source), teaching_presets(load_prompt_sets())))
    with TestClient(app) as c:
        yield c
    source.close()


def sse(response):
    """(event, data) pairs from an SSE body."""
    out, event = [], None
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            out.append((event, json.loads(line.split(":", 1)[1])))
    return out


def chat(client, session, **body):
    with client.stream("POST", "/lab/chat", json={"session": session, **body}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse(r)


def test_stream_then_one_turn_request_with_the_row_and_table_then_exports(client):
    s = client.post("/lab/session").json()["session"]
    events = chat(client, s, message="hi", settings={"max_new_tokens": 4})
    assert [e for e, _ in events][0] == "start" and events[-1][0] == "done"
    assert sum(e == "chunk" for e, _ in events) == 4
    rid = events[0][1]["request_id"]
    browser = {"send_at_ms": 10.0, "arrival_ms": [30, 31, 32, 33], "arrival_tokens": [1, 2, 3, 4],
               "paint_ms": [40, 40, 41, 50], "clock_offset_ms": None}
    assert "table_html" not in client.post("/lab/turn", json={"session": s, "request_id": rid, "client": browser}).json()
    before = time.perf_counter_ns() / 1e6
    timing = client.post("/lab/turn", json={"session": s, "request_id": rid, "client": browser, "table": True}).json()
    assert timing["row"]["client_ttft_ms"] == 40 and timing["client"]["transport_overhead_ms"] is not None
    assert "seen 40 ms" in timing["stats_html"] and timing["what_happened"].startswith("First token")
    assert timing["table_html"].count("<tr>") == 2 and "</tbody>" in timing["table_html"]  # the table came back: its row
    assert before <= timing["server_ms"] <= time.perf_counter_ns() / 1e6  # the server's clock: a clock sample
    assert "replay_html" not in timing  # this router has no after-turn parts (the app adds the replay)
    table = client.get("/lab/table", params={"session": s, "pane": "chat"}).json()
    assert table["count"] == 1 and "<table" in table["html"]
    rows = list(csv.DictReader(io.StringIO(client.get(f"/lab/export/{s}.csv").text)))
    assert rows[0]["request_id"] == rid and rows[0]["client_ttft_ms"] == "40.0"
    exported = client.get(f"/lab/export/{s}.json")
    assert exported.headers["content-disposition"].startswith("attachment")
    assert exported.json()["records"][0]["timeline"]["client"]["paint_ms"] == [40, 40, 41, 50]


def test_bad_requests_get_4xx_with_a_message(client):
    s = client.post("/lab/session").json()["session"]
    r = client.post("/lab/chat", json={"session": s, "message": "hi", "settings": {"temperature": -1}})
    assert r.status_code == 400 and "temperature" in r.json()["detail"]["message"]
    r = client.post("/lab/chat", json={"session": s, "message": "   "})
    assert r.status_code == 400 and "write a message" in r.json()["detail"]["message"]
    r = client.post("/lab/chat", json={"session": "not-a-session", "message": "hi"})
    assert r.status_code == 400 and "reload the page" in r.json()["detail"]["message"]
    assert client.post("/lab/chat", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    r = client.post("/lab/turn", json={"session": s, "request_id": "req-x", "client": {}})
    assert r.status_code == 400
    assert client.get(f"/lab/export/{s}.exe").status_code == 404
    assert client.post("/lab/seed", json={"session": s, "pane": "A", "preset": "nope"}).status_code == 404


def test_stop_cancels_on_the_server_and_the_stream_ends_with_the_partial_reply(client):
    s = client.post("/lab/session").json()["session"]
    stopped = {}

    with client.stream("POST", "/lab/chat", json={"session": s, "message": "long",
                                                  "settings": {"max_new_tokens": 5000}}) as r:
        events, event = [], None
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((event, json.loads(line.split(":", 1)[1])))
                if event == "chunk" and events[-1][1]["n"] == 5 and not stopped:
                    t = threading.Thread(target=lambda: stopped.update(
                        client.post("/lab/stop", json={"session": s, "pane": "chat"}).json()))
                    t.start()
                    t.join()
    assert stopped == {"stopped": True}
    done = events[-1][1]
    assert events[-1][0] == "done" and done["row"]["finish_reason"] == "cancelled"
    assert done["row"]["output_tokens"] < 5000


def test_seed_and_clear(client):
    s = client.post("/lab/session").json()["session"]
    seeded = client.post("/lab/seed", json={"session": s, "pane": "A", "preset": "kv_reuse"}).json()
    assert len(seeded["messages"]) >= 4
    events = chat(client, s, pane="A", message="next", settings={"max_new_tokens": 2})
    assert events[-1][1]["record"]["turn"] == len(seeded["messages"]) // 2 + 1
    assert client.post("/lab/clear", json={"session": s, "pane": "A"}).json() == {"cleared": True}
    events = chat(client, s, pane="A", message="fresh", settings={"max_new_tokens": 2})
    assert events[-1][1]["record"]["turn"] == 1


def test_clock_is_the_server_perf_counter(client):
    a = client.get("/lab/clock").json()["server_ms"]
    b = client.get("/lab/clock").json()["server_ms"]
    assert 0 < b - a < 60_000


def test_the_page_and_lab_endpoints_build_on_an_existing_app():
    """One port: an API app (e.g. the OpenAI-compatible one) keeps its routes next to the page."""
    from ui.webapp import create_app

    api = FastAPI()

    @api.get("/v1/models")
    def models():
        return {"data": ["m"]}

    source = PacedSource(tokens_per_s=1000)
    try:
        with TestClient(create_app(source, app=api)) as c:
            assert c.get("/v1/models").json() == {"data": ["m"]}
            assert c.post("/lab/session").status_code == 200
            page = c.get("/")
            root = re.search(r"/lab/js/[0-9a-f]{12}/", page.text).group(0)  # the scripts' version
            assert page.status_code == 200 and "lab-config" in page.text and root + "entry.js" in page.text  # the head
            entry = c.get(root + "entry.js")  # the scripts: ES modules, served as static files, kept by the browser
            assert entry.status_code == 200 and entry.headers["content-type"].startswith("text/javascript")
            assert "immutable" in entry.headers["cache-control"] and 'from "./chat/session.js"' in entry.text
            assert c.get(root + "chat/overlays.js").status_code == 200
            for not_a_script in ("chat/store.py", "../app.py", "shell/prompts/copy_edits.json", "nope.js"):
                assert c.get(root + not_a_script).status_code == 404, not_a_script
            assert c.get("/lab/js/000000000000/entry.js").status_code == 404  # another version: reload the page
    finally:
        source.close()


def test_the_api_and_the_page_issue_sessions_from_one_registry():
    """One registry (server/sessions.py): an id the page issued is a session of the API's too, with a
    prefix-cache scope per pane beside the API's own; an API id keeps no page state; a made-up id is
    refused by both."""
    from server.api import create_api
    from ui.webapp import create_app

    source = PacedSource(tokens_per_s=1000, prefill_ms=1)
    api = create_api(source)
    store = None
    try:
        with TestClient(create_app(api.state.backends, app=api)) as c:
            store = c.app.state.store
            assert store.sessions is api.state.sessions
            page_id = c.post("/lab/session").json()["session"]
            api_id = c.post("/v1/sessions").json()["id"]
            scope = api.state.sessions.engine_session(page_id)  # the API accepts the page's id
            assert scope.startswith("api:") and store.pane(page_id, "A").conversation.session == scope + "/A"
            r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 2, "session": page_id})
            assert r.status_code == 200, r.text
            refused = c.post("/lab/clear", json={"session": api_id, "pane": "chat"})
            assert refused.status_code == 400 and "unknown or expired session" in refused.text
            for made_up in ("sess_abc.def", "tab-1"):
                assert c.post("/lab/clear", json={"session": made_up, "pane": "chat"}).status_code == 400
                assert c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "session": made_up}).status_code == 400
    finally:
        source.close()
