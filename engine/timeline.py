"""The Timeline: every timestamp of one request, and the metrics derived from them.

Raw events are `time.perf_counter_ns()` readings of the server process. Derived metrics use
the names of the metric glossary (DESIGN.md) and are computed, never stored, so they cannot
drift from the events. Later features add fields (cached tokens, speculation counts, browser
timestamps) in `counters` and `client` without reshaping the record.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

now_ns = time.perf_counter_ns


def _ms(start_ns: int | None, end_ns: int | None) -> float | None:
    if start_ns is None or end_ns is None:
        return None
    return (end_ns - start_ns) / 1e6


@dataclass
class Timeline:
    request_id: str = ""
    received_ns: int = field(default_factory=now_ns)  # request received by the server
    enqueued_ns: int | None = None  # request put on the worker's queue
    started_ns: int | None = None  # the worker takes it
    setup_done_ns: int | None = None  # prompt token ids ready and cache looked up
    prefill_start_ns: int | None = None  # prefill forward begins
    token_ns: list[int] = field(default_factory=list)  # when each output token id was sampled
    chunk_out_ns: list[int] = field(default_factory=list)  # when each chunk was handed to the transport
    chunk_tokens: list[int] = field(default_factory=list)  # output tokens emitted so far, per chunk
    batch_size: list[int] = field(default_factory=list)  # continuous batching: sequences in the forward of token i
    done_ns: int | None = None  # the engine finished (last token, stop, error or cancel)
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (prompt_tokens - cached_tokens)
    cached_tokens: int = 0
    finish_reason: str | None = None  # stop | length | cancelled | error
    queue_position: int | None = None  # position in the queue when enqueued (0: ran at once)
    counters: dict = field(default_factory=dict)  # feature figures: speculation, quantization...
    client: dict = field(default_factory=dict)  # browser timestamps and metrics, joined later

    # --- recording -------------------------------------------------------------------------
    def mark(self, event: str) -> int:
        t = now_ns()
        setattr(self, f"{event}_ns", t)
        return t

    def add_tokens(self, count: int, t_ns: int | None = None) -> int:
        """Record `count` tokens sampled at one instant (a speculative step yields several)."""
        t = now_ns() if t_ns is None else t_ns
        self.token_ns.extend([t] * count)
        return t

    def add_chunk_out(self, output_tokens: int, t_ns: int | None = None) -> None:
        self.chunk_out_ns.append(now_ns() if t_ns is None else t_ns)
        self.chunk_tokens.append(output_tokens)

    # --- derived metrics (glossary names) --------------------------------------------------
    @property
    def output_tokens(self) -> int:
        return len(self.token_ns)

    @property
    def first_token_ns(self) -> int | None:
        return self.token_ns[0] if self.token_ns else None

    @property
    def last_token_ns(self) -> int | None:
        return self.token_ns[-1] if self.token_ns else None

    @property
    def end_ns(self) -> int | None:
        """End of e2e: the last chunk handed to the transport (the engine's end if none was)."""
        return self.chunk_out_ns[-1] if self.chunk_out_ns else self.done_ns

    @property
    def queue_ms(self):
        return _ms(self.enqueued_ns, self.started_ns)

    @property
    def setup_ms(self):
        return _ms(self.started_ns, self.setup_done_ns)

    @property
    def prefill_ms(self):
        return _ms(self.prefill_start_ns, self.first_token_ns)

    @property
    def ttft_ms(self):
        return _ms(self.received_ns, self.first_token_ns)

    @property
    def itl_ms(self) -> list[float]:
        t = self.token_ns
        return [(b - a) / 1e6 for a, b in zip(t, t[1:])]

    @property
    def decode_ms(self):
        return _ms(self.first_token_ns, self.last_token_ns)

    @property
    def tpot_ms(self):
        n = self.output_tokens
        return self.decode_ms / (n - 1) if n > 1 else None

    @property
    def decode_tps(self):
        n, span = self.output_tokens, self.decode_ms
        return (n - 1) / (span / 1e3) if n > 1 and span else None

    @property
    def e2e_ms(self):
        return _ms(self.received_ns, self.end_ns)

    def metrics(self) -> dict:
        """The glossary's scalar metrics (None where the events are missing)."""
        itl = self.itl_ms
        return {
            "queue_ms": self.queue_ms,
            "setup_ms": self.setup_ms,
            "prefill_ms": self.prefill_ms,
            "ttft_ms": self.ttft_ms,
            "decode_ms": self.decode_ms,
            "tpot_ms": self.tpot_ms,
            "decode_tps": self.decode_tps,
            "e2e_ms": self.e2e_ms,
            "itl_p50_ms": statistics.median(itl) if itl else None,
            "itl_max_ms": max(itl) if itl else None,
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "finish_reason": self.finish_reason,
            "queue_position": self.queue_position,
        }

    def to_dict(self) -> dict:
        """JSON-ready: metrics, counters, and the raw events as ms offsets from `received_ns`."""
        origin = self.received_ns

        def rel(t):
            return None if t is None else (t - origin) / 1e6

        return {
            "request_id": self.request_id,
            **self.metrics(),
            "itl_ms": self.itl_ms,
            "events_ms": {
                "received": 0.0,
                "enqueued": rel(self.enqueued_ns),
                "started": rel(self.started_ns),
                "setup_done": rel(self.setup_done_ns),
                "prefill_start": rel(self.prefill_start_ns),
                "done": rel(self.done_ns),
            },
            "token_ms": [rel(t) for t in self.token_ns],
            "chunk_out_ms": [rel(t) for t in self.chunk_out_ns],
            "chunk_tokens": list(self.chunk_tokens),
            **({"batch_size": list(self.batch_size)} if self.batch_size else {}),  # only when batching ran
            "received_ns": origin,
            **self.counters,
            "client": dict(self.client),
        }

    def summary(self) -> str:
        """One line for a terminal: the numbers a person looks at first."""
        m = self.metrics()

        def f(v, unit="ms", nd=0):
            return "n/a" if v is None else f"{v:,.{nd}f}{unit}"

        parts = [
            f"ttft {f(m['ttft_ms'])}",
            f"(queue {f(m['queue_ms'], nd=1)}, setup {f(m['setup_ms'], nd=1)}, prefill {f(m['prefill_ms'])})",
            f"tpot {f(m['tpot_ms'], nd=1)}",
            f"{f(m['decode_tps'], ' tok/s', 1)}",
            f"e2e {f(m['e2e_ms'])}",
            f"prompt {m['prompt_tokens']} tok ({m['cached_tokens']} cached)",
            f"output {m['output_tokens']} tok",
            f"finish {m['finish_reason']}",
        ]
        return " | ".join(parts)
