"""One reply's time as a trace: browser, network and server on one clock (Chrome Trace Event JSON).

`chrome_trace(replies)` turns Timeline records (`Timeline.to_dict()`, the form the API, the page and
the Load tab already hold) into the JSON that ui.perfetto.dev and chrome://tracing open: per reply a
*server* track (received; queue; setup with its KV lookup/copy and compile; prefill with each chunk;
decode with each step — tokens, batch size, prompt tokens sharing the forward, the kernels, a
speculative step's drafted and accepted counts; every chunk handed over; done), and, once the page
joined its timings (`timeline.client`), a *browser* track (send, feedback and status painted, each
chunk's arrival, every paint) and a *network* track (network in: send → received; network out:
each chunk handed over → arrived). Browser times are mapped onto the server clock by the page's
measured offset (server ms − browser ms); the offset and its bound ride on every cross-clock event
as `args`. Events whose ends are unknown (a remote engine's prefill, the browser without an offset)
are absent, never zero. docs/trace.md says what each event means.

Written by hand, not with a library: the format is a list of plain JSON objects ("X" complete events
with ts/dur in µs, "i" instants, "M" metadata), and the Python writers on PyPI target live tracing of
the calling process (viztracer, perfetto's TraceProcessor reads, it does not build from records).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from engine.core.counters import Counters

TRACKS = ("browser", "network", "server")  # top to bottom in the viewer, one process each per reply
# A remote request's network phases (engine/remote/network.py: Timeline spans `net_*`), on the network
# track as sub-stages of network in (this machine → the remote server), and the wait for its answer.
NETWORK_PHASES = {"net_dns": "network in: DNS", "net_connect": "network in: connect",
                  "net_tls": "network in: TLS handshake", "net_send": "network in: request sent",
                  "net_headers": "remote: response headers"}


@dataclass
class Span:
    """One event on the server clock (ns; float where mapped from the browser's ms)."""

    track: str
    name: str
    start_ns: float
    end_ns: float | None = None  # None: an instant
    args: dict = field(default_factory=dict)


def _ns(origin: int, ms) -> float | None:
    """A Timeline record's ms offset (from `received`) back to the server's ns clock."""
    return None if ms is None else origin + round(ms * 1e6)


def server_spans(tl: dict) -> list[Span]:
    """The server track of one Timeline record: each stage, and the work inside it."""
    origin = tl["received_ns"]
    ev = {k: _ns(origin, v) for k, v in (tl.get("events_ms") or {}).items()}
    tokens = [_ns(origin, t) for t in tl.get("token_ms") or []]
    first, last = (tokens[0], tokens[-1]) if tokens else (None, None)
    counters = Counters.from_dict(tl)
    kernels = counters.kernels if isinstance(counters.kernels, dict) else {}
    out = [Span("server", "received", ev["received"], args={"request_id": tl.get("request_id")})]

    def interval(name, start, end, **args):
        if start is not None and end is not None:
            out.append(Span("server", name, start, end, {k: v for k, v in args.items() if v is not None}))

    remote = counters.remote is not None and counters.remote.measured_at == "client"
    interval("queue", ev.get("enqueued"), ev.get("started"), queue_position=tl.get("queue_position"))
    interval("setup", ev.get("started"), ev.get("setup_done"), prompt_tokens=tl.get("prompt_tokens"),
             cached_tokens=tl.get("cached_tokens"), compile_ms=counters.compile_ms,
             capture_ms=counters.capture_ms)
    interval("prefill", ev.get("prefill_start"), first, prefill_tokens=tl.get("prefill_tokens"),
             kernels=kernels.get("prefill"))
    if remote:  # a remote engine: its queue, setup and prefill are on its own machine, not here
        interval("remote: waiting for the first token", ev.get("started"), first)
        headers = counters.remote.response_headers_ms
        if headers is not None:
            out.append(Span("server", "remote: response headers", _ns(origin, headers)))
    interval("decode", first, last, output_tokens=tl.get("output_tokens"), tpot_ms=tl.get("tpot_ms"))
    if first is not None:
        out.append(Span("server", "first token", first))
    # a reply that opens with a thought (engine/core/thinking.py): thinking, then the answer
    interval("thinking", ev.get("thought_first"), ev.get("thought_end"), thought_tokens=tl.get("thought_tokens"),
             source=counters.thought_source)
    if ev.get("thought_first") is not None and ev.get("answer_first") is not None:
        out.append(Span("server", "first answer token", ev["answer_first"], args={"ttfa_ms": tl.get("ttfa_ms")}))
    for s in tl.get("spans_ms") or []:
        if s["name"] == "speculative_step" or s["name"] in NETWORK_PHASES:
            continue  # its counts go on the decode step it was (below); the network's go on its track
        figures = {k: v for k, v in s.items() if k not in ("name", "start_ms", "end_ms") and v is not None}
        interval(s["name"].replace("_", " "), _ns(origin, s["start_ms"]), _ns(origin, s["end_ms"]), **figures)
    out += _decode_steps(tl, origin, tokens, kernels.get("decode"))
    for i, (t, n) in enumerate(zip(tl.get("chunk_out_ms") or [], tl.get("chunk_tokens") or [])):
        out.append(Span("server", "chunk handed over", _ns(origin, t), args={"chunk": i, "output_tokens": n}))
    if ev.get("done") is not None:
        out.append(Span("server", "done", ev["done"], args={"finish_reason": tl.get("finish_reason")}))
    return out


def _decode_steps(tl: dict, origin: int, tokens: list, kernels) -> list[Span]:
    """Each decode step: from one sampling instant to the next (a step may yield several tokens)."""
    spec = {_ns(origin, s["start_ms"]): s for s in tl.get("spans_ms") or [] if s["name"] == "speculative_step"}
    batch, prompt_rows = tl.get("batch_size") or [], tl.get("batch_prompt_tokens") or []
    groups: list[tuple[float, int, int]] = []  # (instant, first token index, tokens)
    for i, t in enumerate(tokens):
        if groups and groups[-1][0] == t:
            groups[-1] = (t, groups[-1][1], groups[-1][2] + 1)
        else:
            groups.append((t, i, 1))
    out = []
    for (prev, _, _), (t, i, n) in pairwise(groups):
        args = {"step": len(out) + 1, "tokens": n, "kernels": kernels,
                "batch_size": batch[i] if i < len(batch) else None,
                "batch_prompt_tokens": prompt_rows[i] if i < len(prompt_rows) else None}
        if prev in spec:
            args.update(drafted=spec[prev]["drafted"], accepted=spec[prev]["accepted"])
        out.append(Span("server", "decode step", prev, t, {k: v for k, v in args.items() if v is not None}))
    return out


def browser_spans(tl: dict, network: str | None = None) -> list[Span]:
    """The browser and network tracks, from the page's joined timings (`timeline.client`); [] when
    the page sent none or the clock offset is unknown (they cannot be placed on the server clock)."""
    c = tl.get("client") or {}
    offset, send_at = c.get("clock_offset_ms"), c.get("send_at_ms")
    if offset is None or send_at is None:
        return []
    clock = {"clock_offset_ms": offset, "clock_bound_ms": c.get("clock_bound_ms")}

    def at(ms):  # ms since send (browser clock) → the server's ns
        return None if ms is None else (send_at + ms + offset) * 1e6

    out = [Span("browser", "send (key press)", at(0.0), args=dict(clock))]
    paints = [p for p in c.get("shown_paint_ms") or [] if p is not None]
    end = max(paints + [p for p in c.get("paint_ms") or [] if p is not None], default=None)
    if end is not None:
        out.append(Span("browser", "reply: send → last paint", at(0.0), at(end), dict(clock)))
    for name, key in (("feedback painted", "feedback_ms"), ("status painted", "status_ms")):
        if c.get(key) is not None:
            out.append(Span("browser", name, at(c[key]), args=dict(clock)))
    arrival, tokens = c.get("arrival_ms") or [], c.get("arrival_tokens") or []
    for i, t in enumerate(arrival):
        out.append(Span("browser", "first chunk arrived" if i == 0 else "chunk arrived", at(t),
                        args={"chunk": i, "output_tokens": tokens[i] if i < len(tokens) else None, **clock}))
    for t, chars in zip(c.get("shown_paint_ms") or [], c.get("shown_chars") or []):
        if t is not None:
            out.append(Span("browser", "paint", at(t), args={"visible_chars": chars, **clock}))
    # network: measured across the two clocks (so within ± the bound), the simulated link named
    link = {"link": network, **clock} if network else dict(clock)
    origin = tl["received_ns"]
    out.append(Span("network", "network in", at(0.0), origin, link))
    outs = tl.get("chunk_out_ms") or []
    if len(outs) == len(arrival):  # one SSE event per chunk handed over
        for i, (sent, got) in enumerate(zip(outs, arrival)):
            out.append(Span("network", "network out", _ns(origin, sent), at(got), {"chunk": i, **link}))
    return out


def network_phase_spans(tl: dict) -> list[Span]:
    """A remote request's DNS, connect, TLS, request sent and response headers (only those that ran:
    a reused connection has no connect or TLS)."""
    origin = tl["received_ns"]
    out = []
    for s in tl.get("spans_ms") or []:
        if s["name"] in NETWORK_PHASES:
            args = {k: v for k, v in s.items() if k not in ("name", "start_ms", "end_ms") and v is not None}
            out.append(Span("network", NETWORK_PHASES[s["name"]], _ns(origin, s["start_ms"]), _ns(origin, s["end_ms"]),
                            args))
    return out


def reply_spans(tl: dict, network: str | None = None) -> list[Span]:
    return server_spans(tl) + network_phase_spans(tl) + browser_spans(tl, network)


def chrome_trace(replies: list[tuple[str, dict]] | list[dict], network: dict | None = None) -> dict:
    """The Chrome Trace Event JSON of one or more replies on one timeline.

    `replies`: Timeline records, or (label, record) pairs (label names the reply's processes, e.g.
    the A/B pane); `network`: {request_id: the simulated link's description}. Timestamps are µs
    after the earliest event of all replies, on the server's clock (`otherData.origin_server_ms`)."""
    pairs = [(r if isinstance(r, tuple) else (None, r)) for r in replies]
    per_reply = [(label, tl, reply_spans(tl, (network or {}).get(tl.get("request_id")))) for label, tl in pairs]
    starts = [s.start_ns for _, _, spans in per_reply for s in spans]
    origin = min(starts) if starts else 0
    events, mapping = [], []
    for k, (label, tl, spans) in enumerate(per_reply):
        name = label or tl.get("request_id") or f"reply {k + 1}"
        pids = {}
        for j, track in enumerate(TRACKS):
            mine = [s for s in spans if s.track == track]
            if not mine:
                continue
            pid = pids[track] = k * len(TRACKS) + j + 1
            events += [_meta("process_name", pid, f"{name} · {track}"),
                       _meta("process_sort_index", pid, pid, key="sort_index"),
                       _meta("thread_name", pid, track)]
            mine.sort(key=lambda s: (s.start_ns, -((s.end_ns or s.start_ns) - s.start_ns)))
            events += [_event(s, pid, origin) for s in mine]
        c = tl.get("client") or {}
        mapping.append({"label": name, "request_id": tl.get("request_id"), "browser_pid": pids.get("browser"),
                        "send_at_ms": c.get("send_at_ms"), "clock_offset_ms": c.get("clock_offset_ms"),
                        "clock_bound_ms": c.get("clock_bound_ms")})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "Latency Lab", "clock": "server perf_counter", "origin_server_ms": origin / 1e6,
                          "replies": mapping}}


def _us(ns: float) -> float:
    return round(ns / 1e3, 3)


def _event(s: Span, pid: int, origin: float) -> dict:
    args = {k: v for k, v in s.args.items() if v is not None}
    if s.end_ns is None:
        return {"name": s.name, "cat": s.track, "ph": "i", "s": "t", "ts": _us(s.start_ns - origin),
                "pid": pid, "tid": 1, "args": args}
    dur = _us(s.end_ns - s.start_ns)
    if dur < 0:  # only across the two clocks, within the offset's bound: keep it visible, say so
        args["measured_dur_us"], dur = dur, 0.0
    return {"name": s.name, "cat": s.track, "ph": "X", "ts": _us(s.start_ns - origin), "dur": dur,
            "pid": pid, "tid": 1, "args": args}


def _meta(what: str, pid: int, value, key: str = "name") -> dict:
    return {"name": what, "ph": "M", "pid": pid, "tid": 1, "ts": 0, "args": {key: value}}
