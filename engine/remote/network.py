"""The network phases of every remote request: DNS, connect, TLS, request sent, response headers.

httpcore (under httpx) reports each step of an exchange to a request's `trace` extension
(`connection.connect_tcp.started`/`.complete`, `connection.start_tls.*`, `http11.send_request_*`,
`http11.receive_response_headers.*`; README "Extensions" in encode/httpcore). DNS is inside
`connect_tcp` there, so `ResolvingBackend` looks the host up itself, timed, and connects to the
addresses it got. `Phases` turns both into Timeline spans (`net_dns`, `net_connect`, `net_tls`,
`net_send`, `net_headers`; each with its `exchange`: "chat", or "session" for the one POST
/sessions a session's first request to another Latency Lab makes) and, when the request ends, into
scalar figures in `counters.network` (engine/core/counters.py NetworkCounters; glossary names):

- `net_dns_ms`, `net_connect_ms`, `net_tls_ms`: time spent opening connections for this request
  (null where no connection was opened: a reused connection has no such phase; DNS also null for
  an address given as an IP);
- `net_send_ms`: the chat request's headers and body written; `net_headers_ms`: from then until its
  response headers were read (the server's time to answer plus a round trip);
- `connection_reused`: true when the request opened no connection (the pool's keep-alive one
  served it); null when it failed before its response headers.

All readings come from the one clock (engine/core/timeline.py `now_ns`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from contextvars import ContextVar

import httpcore
import httpx

from engine.core.counters import NetworkCounters
from engine.core.timeline import Timeline, now_ns

# httpcore's step → our phase, and whether the step starts or ends it
STEPS = {"connect_tcp": "connect", "start_tls": "tls", "send_request_headers": "send",
         "send_request_body": "send", "receive_response_headers": "headers"}
_current: ContextVar[Phases | None] = ContextVar("latency_lab_network_phases", default=None)


class Phases:
    """One remote request's phases, recorded on its Timeline. Use `extensions(exchange)` for each
    HTTP exchange of the request, inside `recording()` (the DNS lookup finds its request by context)."""

    def __init__(self, timeline: Timeline):
        self.tl = timeline
        self.exchange = ""
        self._started: dict[str, int] = {}
        self._dns_end: int | None = None

    def recording(self) -> None:
        """This task's connections report their DNS lookup here (the request's own task: a context var)."""
        _current.set(self)

    def extensions(self, exchange: str) -> dict:
        self.exchange, self._started, self._dns_end = exchange, {}, None
        return {"trace": self._trace}

    def dns(self, start_ns: int, end_ns: int, addresses: int) -> None:
        self._dns_end = end_ns
        self.tl.add_span("net_dns", start_ns, end_ns, exchange=self.exchange, addresses=addresses)

    async def _trace(self, name: str, info: dict) -> None:
        t = now_ns()
        step, _, event = name.rpartition(".")
        step = step.rpartition(".")[2]
        phase = STEPS.get(step)
        if phase is None:
            return
        if event == "started":
            if step != "send_request_body":  # the send phase runs from its headers to its body's end
                self._started[phase] = t
            return
        start = self._started.pop(phase, None) if step != "send_request_headers" else None
        if event != "complete" or start is None:
            return  # a failed step: the request's error says what happened
        figures = {}
        if phase == "connect" and self._dns_end is not None:
            start = self._dns_end  # the lookup ran inside connect_tcp: connect is what came after it
        if phase == "tls":
            ssl_object = _extra(info.get("return_value"), "ssl_object")
            figures["tls_version"] = ssl_object.version() if ssl_object is not None else None
        if phase == "headers":
            value = info.get("return_value")
            if isinstance(value, tuple) and value and isinstance(value[0], bytes):
                figures["http_version"] = value[0].decode("ascii", "replace")
        self.tl.add_span(f"net_{phase}", start, t, exchange=self.exchange,
                         **{k: v for k, v in figures.items() if v is not None})

    def finish(self) -> None:
        """The scalar figures, in the Timeline's counters (see the module docstring)."""
        spans = [s for s in self.tl.spans if s["name"].startswith("net_")]

        def total(phase, exchange=None):
            found = [s for s in spans if s["name"] == f"net_{phase}" and exchange in (None, s["exchange"])]
            return sum(s["end_ns"] - s["start_ns"] for s in found) / 1e6 if found else None

        c = self.tl.counters.network = NetworkCounters(
            net_dns_ms=total("dns"), net_connect_ms=total("connect"), net_tls_ms=total("tls"),
            net_send_ms=total("send", "chat"), net_headers_ms=total("headers", "chat"))
        answered = c.net_headers_ms is not None
        c.connection_reused = (c.net_connect_ms is None) if answered else None


def _extra(stream, key: str):
    try:
        return stream.get_extra_info(key) if stream is not None else None
    except Exception:  # a backend without that information
        return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


class ResolvingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, with the host name looked up first, timed (getaddrinfo on the event
    loop's executor), then each address tried in the resolver's order until one connects (as
    httpcore's sync backend and `socket.create_connection` do; its async default tries them
    interleaved, RFC 8305, which would hide the lookup inside connect)."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend):
        self.inner = inner

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        phases = _current.get()
        if phases is None or _is_ip(host):
            return await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        t0 = now_ns()
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise httpcore.ConnectError(f"could not look up {host}: {exc}") from exc
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        phases.dns(t0, now_ns(), len(addresses))
        error = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        raise error or httpcore.ConnectError(f"{host} has no address")

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return await self.inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def transport(**kwargs) -> httpx.AsyncHTTPTransport:
    """An httpx transport whose connections time their DNS lookup (ResolvingBackend). httpx offers
    no public way to hand httpcore a network backend, so its pool's is wrapped in place; where that
    attribute is missing (another httpx), DNS stays inside connect and `net_dns_ms` is null."""
    t = httpx.AsyncHTTPTransport(**kwargs)
    pool = getattr(t, "_pool", None)
    if isinstance(getattr(pool, "_network_backend", None), httpcore.AsyncNetworkBackend):
        pool._network_backend = ResolvingBackend(pool._network_backend)
    return t
