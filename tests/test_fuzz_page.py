"""The page's inputs, fuzzed: its Gradio API through `gradio_client` (/chat, /sweep) and its /lab
endpoints over HTTP, on the app exactly as `python app.py` wires it (API + /lab + page, one port,
bundled model, fp32). Bad input is an error the page can show — an `error` event, a gr.Error, a
4xx with a message — never a crash of the app, never an internal error, never a dead worker."""

import json
import re

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.config import GenerationConfig
from server.api import create_api
from server.run import BackgroundServer

FUZZ = dict(deadline=None, derandomize=True, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
GENERIC = "has not enabled verbose error reporting"  # Gradio's words for an exception that was not a gr.Error


@pytest.fixture(scope="module")
def page(bundled_engine):
    from ui.webapp import create_app

    api = create_api(bundled_engine)
    with BackgroundServer(create_app(api.state.backends, app=api)) as url:
        with httpx.Client(base_url=url, timeout=120) as http:
            yield type("Page", (), {"url": url, "http": http, "client": Client(url + "/", verbose=False)})


LONE = st.sampled_from(["\ud800", "x\udfff", "\udc00"])
PLAIN = st.one_of(st.text(max_size=40), st.sampled_from(["", "  ", "\x00", "\u202e", "😀" * 4, "<|im_end|>"]))
TEXT = st.one_of(PLAIN, LONE)
NUMBER = st.one_of(st.integers(-(2**66), 2**66), st.floats(allow_nan=True, allow_infinity=True))
FINITE = st.one_of(st.integers(-(2**66), 2**66), st.floats(allow_nan=False, allow_infinity=False))


def junk(text, number=NUMBER):
    return st.recursive(st.one_of(st.none(), st.booleans(), number, text),
                        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
                        max_leaves=8)


def pane_settings(text, number=NUMBER):
    """A pane's settings as the page sends them, each one valid or junk; max_new_tokens always small
    when valid. No falsy junk: the page reads missing or empty settings as the defaults (256 tokens)."""
    bad = junk(text, number)
    return st.one_of(bad.filter(bool), st.builds(lambda base, extra: {**base, **extra}, st.fixed_dictionaries(
        {"max_new_tokens": st.one_of(st.integers(1, 3), st.floats(1, 3).map(round).map(float), bad)}),
        st.fixed_dictionaries({}, optional={
            "temperature": st.one_of(st.floats(0, 2), bad), "top_p": st.one_of(st.floats(0.05, 1), bad),
            "seed": st.one_of(st.integers(-1, 2**40), st.just(""), bad), "kv_reuse": st.one_of(st.booleans(), bad),
            "speculative": st.one_of(st.sampled_from(["off", "prompt_lookup", "draft"]), bad),
            "num_speculative_tokens": st.one_of(st.integers(1, 16), bad), "system": text,
            "quantization": st.one_of(st.sampled_from(["default", ""]), text), "backend": st.one_of(st.none(), text),
            "model": text, "unknown": bad})))


JUNK = junk(TEXT)
SETTINGS = pane_settings(TEXT)  # sent inside a JSON string we encode: lone surrogates travel as escapes
PLAIN_SETTINGS = pane_settings(PLAIN, FINITE)  # sent by gradio_client itself: no lone surrogates, NaN or inf
CHAT_PAYLOAD = st.fixed_dictionaries({"message": st.one_of(TEXT, JUNK), "settings": SETTINGS},
                                     optional={"pane": st.one_of(st.sampled_from(["chat", "A", "B"]), JUNK),
                                               "session": JUNK, "regenerate": JUNK})


def events(out: str) -> list[tuple[str, dict]]:
    return [(e["event"], e["data"]) for e in map(json.loads, out.splitlines())]


def check_events(evs) -> None:
    """A turn's events end in done or error; an error says what to change (not an internal error)."""
    assert evs, "no events at all"
    kind, data = evs[-1]
    assert kind in ("done", "error"), evs[-1]
    if kind == "error":
        assert isinstance(data["message"], str) and data["message"].strip()
        assert not data["message"].startswith("internal error"), data["message"]
    else:
        assert evs[0][0] == "start" and data["record"]["timeline"]["output_tokens"] <= 3


@settings(max_examples=30, **FUZZ)
@given(payload=CHAT_PAYLOAD)
def test_gradio_chat_with_fuzzed_payloads(page, payload):
    # Encoded here (ASCII, lone surrogates as \\ud800 escapes): the payload is a JSON string by design.
    check_events(events(page.client.predict(json.dumps(payload, ensure_ascii=True), api_name="/chat")))


@settings(max_examples=15, **FUZZ)
@given(raw=st.text(max_size=80))
def test_gradio_chat_with_a_payload_that_is_any_text(page, raw):
    check_events(events(page.client.predict(raw, api_name="/chat")))


@settings(max_examples=15, **FUZZ)
@given(prompt_set=st.one_of(st.sampled_from(["custom", "open_questions", "copy_edits"]), st.text(max_size=20)),
       prompts=st.one_of(st.just("Say yes.\nSay no."), st.text(max_size=60)),
       settings_a=PLAIN_SETTINGS, settings_b=PLAIN_SETTINGS,
       max_items=st.one_of(st.integers(1, 2), st.integers(-(2**40), 0), st.integers(2**31, 2**62)))
def test_gradio_sweep_with_fuzzed_arguments(page, prompt_set, prompts, settings_a, settings_b, max_items):
    if isinstance(settings_a, dict) and isinstance(settings_b, dict) and max_items > 0:
        settings_a = {**settings_a, "max_new_tokens": 2}  # a valid sweep stays short: at most 2 items x 2
        settings_b = {**settings_b, "max_new_tokens": 2}
        max_items = min(max_items, 2)
    try:
        result = page.client.predict(prompt_set, prompts, settings_a, settings_b, max_items, api_name="/sweep")
    except AppError as exc:  # a gr.Error: the page shows its message
        assert GENERIC not in str(exc) and str(exc).strip(), str(exc)
        return
    assert isinstance(result["rows"], list) and result["rows"] and isinstance(result["summary"], list)


def lab_ok(resp: httpx.Response) -> None:
    """Never a 5xx; an error is JSON with a message the page shows (OpenAI shape, or FastAPI's 422)."""
    assert resp.status_code < 500, resp.text[:300]
    if resp.status_code >= 400:
        body = resp.json()
        assert body.get("error", {}).get("message") or body.get("detail"), body


@settings(max_examples=30, **FUZZ)
@given(body=st.one_of(JUNK, CHAT_PAYLOAD))
def test_lab_chat_with_fuzzed_bodies(page, body):
    if isinstance(body, dict) and body.get("session") is None:
        body = {**body, "session": page.http.post("/lab/session").json()["session"]}
    resp = page.http.post("/lab/chat", content=json.dumps(body, ensure_ascii=True),
                          headers={"Content-Type": "application/json"})
    lab_ok(resp)
    if resp.status_code == 200:
        evs, kind = [], None
        for line in resp.text.splitlines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                evs.append((kind, json.loads(line.split(":", 1)[1])))
        check_events(evs)


@pytest.fixture(scope="module")
def reply(page):
    """A session with one real reply, so the turn/table/delta/export endpoints reach their checks."""
    s = page.http.post("/lab/session").json()["session"]
    resp = page.http.post("/lab/chat", json={"session": s, "message": "Say hi.", "settings": {"max_new_tokens": 2}})
    rid = next(json.loads(line[5:])["request_id"] for line in resp.text.splitlines() if line.startswith("data:"))
    return s, rid


@settings(max_examples=40, **FUZZ)
@given(client=JUNK, junk=JUNK, pane=st.one_of(st.sampled_from(["chat", "A"]), TEXT), preset=TEXT)
def test_lab_endpoints_with_fuzzed_fields(page, reply, client, junk, pane, preset):
    s, rid = reply
    http = page.http

    def post(path, body):
        content = json.dumps(body, ensure_ascii=True)
        lab_ok(http.post(path, content=content, headers={"Content-Type": "application/json"}))

    post("/lab/turn", {"session": s, "request_id": rid, "client": client, "table": True})
    post("/lab/turn", {"session": s, "request_id": junk, "client": {"arrival_ms": junk, "paint_ms": junk}, "table": junk})
    post("/lab/stop", {"session": s, "pane": pane})
    post("/lab/seed", {"session": s, "pane": pane, "preset": preset})
    post("/lab/clear", {"session": junk, "pane": pane})
    text = pane if isinstance(pane, str) and pane.isascii() else "x"
    lab_ok(http.get("/lab/table", params={"session": s, "pane": text}))
    lab_ok(http.get("/lab/delta", params={"session": s, "a": rid, "b": text}))
    lab_ok(http.get(f"/lab/export/{re.sub(r'[^A-Za-z0-9_-]', '', text) or 'x'}.csv"))


def test_the_worker_survived_the_page_fuzzing(page, bundled_engine):
    assert bundled_engine.worker._thread.is_alive()
    out = events(page.client.predict(json.dumps({"message": "Say hi.", "settings": {"max_new_tokens": 3,
                                                                                   "temperature": 0}}),
                                     api_name="/chat"))
    direct = bundled_engine.complete([{"role": "user", "content": "Say hi."}],
                                     GenerationConfig(temperature=0.0, max_new_tokens=3))
    assert out[-1][0] == "done" and out[-1][1]["record"]["reply"] == direct.text
