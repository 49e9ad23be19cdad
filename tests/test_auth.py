"""With --api-key, every route of the whole app (API, page, /lab, Gradio's own routes) refuses a
request without the key; /health and /metrics stay open. The routes are walked from the app, so a
route added later is covered without touching this test. Uses the paced test source (no model)."""

import re

import httpx
import pytest
from starlette.routing import Mount

from server.api import create_api
from server.auth import COOKIE, cookie_token
from server.run import BackgroundServer
from ui.chat.paced import PacedSource
from ui.webapp import create_app

KEY = "s3cret-key"
OPEN = {"/health", "/metrics", "/login"}


def walk(routes, prefix=""):
    """(method, path) for every route, mounted sub-apps included; path parameters filled in."""
    for route in routes:
        if isinstance(route, Mount):
            yield from walk(route.routes, prefix + route.path)
            continue
        if hasattr(route, "original_router"):  # FastAPI's include_router (the page's /lab)
            yield from walk(route.original_router.routes, prefix + getattr(route.include_context, "prefix", ""))
            continue
        path = getattr(route, "path", None)
        if path is None:
            continue
        full = re.sub(r"\{[^}]+\}", "x", prefix + path) or "/"
        methods = getattr(route, "methods", None) or {"GET"}  # a websocket route: probed as GET
        for method in sorted(methods - {"HEAD", "OPTIONS"}) or ["GET"]:
            yield method, full


@pytest.fixture(scope="module")
def server():
    source = PacedSource(tokens_per_s=2000, prefill_ms=1)
    api = create_api({"paced": source}, api_key=KEY)
    app = create_app(api.state.backends, app=api)
    with BackgroundServer(app) as url:
        yield url, sorted(set(walk(app.routes)))
    source.close()


def request(url, method, path, headers=None):
    """The status of one request; the body is not read (a stream that was let in may run on)."""
    with httpx.Client(base_url=url, timeout=10, follow_redirects=False) as http:
        with http.stream(method, path, headers=headers or {}, json={} if method in ("POST", "PUT", "PATCH") else None) as r:
            return r.status_code, r.headers


def refused_by_us(status, headers) -> bool:
    """Our refusal (server/auth.py), told apart from a route's own 403 (Gradio refusing a file path)."""
    return status == 401 and "latency-lab" in headers.get("www-authenticate", "")


def test_the_walk_finds_the_page_lab_and_api_routes(server):
    _, routes = server
    paths = {p for _, p in routes}
    assert {"/v1/chat/completions", "/v1/models", "/lab/chat", "/lab/session", "/health", "/metrics"} <= paths
    assert any(p.startswith("/gradio_api") for p in paths)  # the mounted page's own routes


def test_every_route_refuses_a_request_without_the_key(server):
    url, routes = server
    let_in = []
    for method, path in routes:
        if path in OPEN:
            continue
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{COOKIE}=forged"}):
            status, got = request(url, method, path, headers)
            if not refused_by_us(status, got):
                let_in.append((method, path, headers, status))
    assert not let_in, let_in


def test_a_browser_is_sent_to_the_login_form_and_its_cookie_opens_the_page(server):
    url, _ = server
    status, headers = request(url, "GET", "/", {"Accept": "text/html"})
    assert status == 303 and headers["location"].startswith("/login")
    with httpx.Client(base_url=url, timeout=10) as http:
        assert "password" in http.get("/login").text
        assert http.post("/login", data={"key": "nope", "next": "/"}).status_code == 401
        ok = http.post("/login", data={"key": KEY, "next": "https://evil.example/"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/"  # never sent off-site
        assert "HttpOnly" in ok.headers["set-cookie"] and KEY not in ok.headers["set-cookie"]
        page = http.get("/")  # the cookie is kept by the client
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert http.post("/lab/session").status_code == 200


def test_with_the_key_the_routes_are_let_in(server):
    url, routes = server
    refused = []
    for method, path in routes:
        for headers in ({"Authorization": f"Bearer {KEY}"}, {"Cookie": f"{COOKIE}={cookie_token(KEY)}"}):
            try:
                status, got = request(url, method, path, headers)
            except httpx.ReadTimeout:  # let in, and streaming or waiting on a body
                continue
            if refused_by_us(status, got):
                refused.append((method, path, status))
    assert not refused, refused


def test_health_and_metrics_stay_open(server):
    url, _ = server
    assert httpx.get(url + "/health").json()["status"] == "ok"
    assert httpx.get(url + "/metrics").status_code == 200
