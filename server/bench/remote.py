"""An OpenAI-compatible server measured from the client side, beside the timings it reports.

Client figures (this machine's clock): ttft = request sent → first text chunk arrived; itl =
gaps between text chunks; e2e = request sent → stream ended. Server figures: whatever the server
returns (ours: the glossary's `timings`). `transport_overhead_ms` = client ttft − server ttft.

Without --base-url the bench serves the local model itself, through our API on a free loopback
port, and measures that: the difference is then the cost of HTTP + SSE + JSON alone. It also
runs each prompt once in-process and reports whether the text through the API is `identical`.
`ratio` = client ttft / server ttft (medians). Each request's network phases too (DNS, connect, TLS,
request sent, response headers: engine/remote/network.py): the warm-up request's, which opens the
connection, and how many of the measured ones rode it kept alive.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict

from engine.bench import CHAT_PROMPTS, load_model, median
from engine.core.counters import NetworkCounters


def add_args(p):
    p.add_argument("--base-url", default=None,
                   help="the server's API root, e.g. http://host:8000/v1 (default: serve the local model on loopback)")
    p.add_argument("--remote-model", default=None, help="the model name the server serves")
    p.add_argument("--remote-api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3, help="passes over the prompts")
    p.add_argument("--prompts", type=int, default=len(CHAT_PROMPTS))


def run(args, out):
    from engine.core.config import GenerationConfig
    from engine.core.errors import InvalidRequest
    from engine.remote.client import RemoteEngine

    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0)
    prompts = [[{"role": "user", "content": p}] for p in CHAT_PROMPTS[: args.prompts]]
    with contextlib.ExitStack() as stack:
        local = None
        if args.base_url is None:
            from engine.serving.service import Engine
            from server.api import (
                create_api,  # the bench serves itself: engine → our API → loopback
            )
            from server.run import BackgroundServer

            local = Engine(load_model(args))
            stack.callback(local.close)
            server = BackgroundServer(create_api(local))
            base_url, model = server.start() + "/v1", local.info().name
            stack.callback(server.stop)
        elif not args.remote_model:
            raise InvalidRequest("--base-url needs --remote-model NAME", "remote_model")
        else:
            base_url, model = args.base_url, args.remote_model
        # self-hosted: ours speaks OpenAI's dialect, so no Ollama probe opens the connection before the warm-up
        remote = RemoteEngine(base_url, model, api_key=args.remote_api_key,
                              dialect="openai" if local is not None else "auto")
        stack.callback(remote.close)
        out(f"{model} at {base_url}: {len(prompts)} prompts x {args.runs} runs, greedy, "
            f"{args.max_new_tokens} new tokens")
        warm = remote.complete(prompts[0], gen).timeline.counters  # warm-up: connection, first-run allocations
        opening = network_row(warm)
        out("first request's network phases (a connection opened, unless the dialect probe opened it): "
            + ", ".join(f"{k} {_ms(v)}" for k, v in opening.items()))

        rows, texts = [], {}
        for run_i in range(args.runs):
            for i, messages in enumerate(prompts):
                done = remote.complete(messages, gen)
                tl, r = done.timeline, done.timeline.counters.remote
                server = r.server_timings or {}
                row = {"client_ttft_ms": tl.ttft_ms, "server_ttft_ms": r.server_ttft_ms,
                       "transport_overhead_ms": r.transport_overhead_ms,
                       "client_itl_p50_ms": tl.metrics()["itl_p50_ms"], "client_e2e_ms": tl.e2e_ms,
                       "server_e2e_ms": server.get("e2e_ms"), "client_decode_tps": tl.decode_tps,
                       "chunks": r.chunks, "completion_tokens": r.completion_tokens,
                       **network_row(tl.counters)}
                rows.append(row)
                texts.setdefault(i, set()).add(done.text)
                out(f"run {run_i} prompt {i}: " + " | ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

        identical = None
        if local is not None:  # same prompts in-process: the API path must not change the text
            identical = all(texts[i] == {local.complete(m, gen).text} for i, m in enumerate(prompts))
        elif args.runs > 1:
            identical = all(len(t) == 1 for t in texts.values())  # greedy: the server repeats itself

    def med(key):
        return median([r[key] for r in rows])

    overheads = [r["transport_overhead_ms"] for r in rows if r["transport_overhead_ms"] is not None]
    result = {"base_url": base_url, "model": model, "requests": len(rows), "self_hosted": local is not None,
              **{f"{k}_p50": med(k) for k in ("client_ttft_ms", "server_ttft_ms", "transport_overhead_ms",
                                               "client_itl_p50_ms", "client_e2e_ms", "server_e2e_ms",
                                               "client_decode_tps")},
              **{f"{k}_p50": med(k) for k in ("net_send_ms", "net_headers_ms")},
              "first_request_network": opening,
              "connections_reused": sum(r["connection_reused"] is True for r in rows),
              "transport_overhead_ms_min": min(overheads) if overheads else None,
              "transport_overhead_ms_max": max(overheads) if overheads else None,
              "identical": identical}
    c, s = result["client_ttft_ms_p50"], result["server_ttft_ms_p50"]
    result["ratio"] = round(c / s, 3) if c and s else None
    out(f"client ttft p50 {c} ms vs server ttft p50 {s} ms; transport overhead p50 "
        f"{result['transport_overhead_ms_p50']} ms; identical {identical}")
    out(f"{result['connections_reused']} of {len(rows)} requests rode a kept-alive connection; request sent p50 "
        f"{_ms(result['net_send_ms_p50'])}, response headers p50 {_ms(result['net_headers_ms_p50'])}")
    return result


def network_row(counters) -> dict:
    """A remote request's network phases (engine/remote/network.py; null where the phase did not run)."""
    return asdict(counters.network or NetworkCounters())


def _ms(v) -> str:
    return "n/a" if v is None else str(v) if isinstance(v, bool) else f"{v:.2f} ms"
