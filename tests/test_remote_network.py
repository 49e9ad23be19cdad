"""A remote request's network phases (engine/remote/network.py) against a local HTTPS server whose
self-signed certificate the test makes (Debian's `openssl`): a new connection shows DNS, connect
and TLS, a reused one none of them; request sent and response headers always; the trace, the
OpenTelemetry spans and our API's `timings` carry them. No model."""

import shutil
import ssl
import subprocess
import threading
import time

import openai
import pytest
import uvicorn
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import ask
from test_remote_dialects import GREEDY, delta, sse_server

from engine.measure.otel import OtlpExport
from engine.measure.trace import chrome_trace
from engine.remote.client import RemoteEngine
from server.api import create_api
from server.run import BackgroundServer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command (Debian: openssl)")
OPENING = ("net_dns_ms", "net_connect_ms", "net_tls_ms")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
    return key, cert


@pytest.fixture(scope="module")
def https_port(certificate):
    """An OpenAI-style server (fixed chunks) on https://127.0.0.1:PORT with the test's certificate."""
    key, cert = certificate
    server = uvicorn.Server(uvicorn.Config(sse_server([delta("o"), delta("k", "stop")]), host="127.0.0.1", port=0,
                                           log_level="warning", ssl_keyfile=str(key), ssl_certfile=str(cert)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the HTTPS server did not start"
        time.sleep(0.01)
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(10)


def engine_for(url, certificate):
    return RemoteEngine(url + "/v1", "m", dialect="openai",
                        verify=ssl.create_default_context(cafile=str(certificate[1])))


def phases(tl) -> dict:
    return {s["name"]: s for s in tl.spans if s["name"].startswith("net_")}


def test_a_new_https_connection_shows_dns_connect_and_tls_and_a_reused_one_none(https_port, certificate):
    engine = engine_for(f"https://localhost:{https_port}", certificate)
    try:
        first = engine.complete(ask("hi"), GREEDY).timeline
        again = engine.complete(ask("hi"), GREEDY).timeline
    finally:
        engine.close()
    c = first.counters
    assert all(getattr(c.network, k) is not None and getattr(c.network, k) >= 0
               for k in (*OPENING, "net_send_ms", "net_headers_ms"))
    assert c.network.connection_reused is False
    p = phases(first)
    assert p["net_dns"]["addresses"] >= 1 and p["net_tls"]["tls_version"].startswith("TLS")
    assert p["net_headers"]["http_version"] == "HTTP/1.1"
    # one after the other, on the one clock: the lookup, the connect, the handshake, the request, its answer
    order = [p[n] for n in ("net_dns", "net_connect", "net_tls", "net_send", "net_headers")]
    assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(order, order[1:]))
    assert first.started_ns <= p["net_dns"]["start_ns"] and p["net_headers"]["end_ns"] <= first.token_ns[0]
    # the same engine's next request rides the kept-alive connection: no DNS, connect or TLS at all
    c2 = again.counters
    assert c2.network.connection_reused is True and all(getattr(c2.network, k) is None for k in OPENING)
    assert set(phases(again)) == {"net_send", "net_headers"}
    assert c2.network.net_headers_ms is not None


def test_an_ip_address_needs_no_lookup(https_port, certificate):
    engine = engine_for(f"https://127.0.0.1:{https_port}", certificate)
    try:
        c = engine.complete(ask("hi"), GREEDY).timeline.counters
    finally:
        engine.close()
    assert c.network.net_dns_ms is None and c.network.net_connect_ms is not None and c.network.net_tls_ms is not None


def test_the_trace_and_otel_carry_the_phases(https_port, certificate):
    engine = engine_for(f"https://localhost:{https_port}", certificate)
    try:
        tl = engine.complete(ask("hi"), GREEDY).timeline
    finally:
        engine.close()
    events = chrome_trace([tl.to_dict()])["traceEvents"]
    network = {e["name"]: e for e in events if e.get("cat") == "network"}
    assert {"network in: DNS", "network in: connect", "network in: TLS handshake", "network in: request sent",
            "remote: response headers"} <= set(network)
    assert network["network in: TLS handshake"]["dur"] == pytest.approx(tl.counters.network.net_tls_ms * 1e3, abs=0.01)
    assert not [e for e in events if e.get("cat") == "server" and e["name"].startswith("net")]

    exporter = InMemorySpanExporter()
    export = OtlpExport(exporter=exporter)
    export.export(tl, "m")
    export.flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["network in: TLS handshake"].attributes["latency_lab.tls_version"].startswith("TLS")
    assert spans["chat m"].attributes["latency_lab.connection_reused"] is False
    export.shutdown()


def test_a_connection_refused_says_so_and_claims_no_reuse():
    engine = RemoteEngine("https://localhost:9/v1", "m", dialect="openai")
    try:
        handle = engine.submit(ask("hi"), GREEDY)
        with pytest.raises(Exception, match="could not talk to"):
            handle.result(timeout=30)
    finally:
        engine.close()
    c = handle.timeline.counters
    assert c.network.connection_reused is None and c.network.net_headers_ms is None


def test_our_api_serving_a_remote_backend_puts_the_phases_in_timings(https_port, certificate):
    engine = engine_for(f"https://localhost:{https_port}", certificate)
    try:
        with BackgroundServer(create_api({"m": engine})) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
            timings = [client.chat.completions.create(model="m", messages=ask("hi"), max_tokens=4)
                       .model_extra["timings"] for _ in range(2)]
    finally:
        engine.close()
    assert timings[0]["connection_reused"] is False and timings[0]["net_tls_ms"] is not None
    assert timings[1]["connection_reused"] is True and timings[1]["net_tls_ms"] is None
    assert timings[1]["net_headers_ms"] is not None


def test_every_network_figure_is_in_the_glossary():
    from ui.shell.glossary import METRICS

    for name in (*OPENING, "net_send_ms", "net_headers_ms", "connection_reused"):
        assert METRICS[name].end, name
