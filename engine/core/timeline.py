"""The Timeline: every timestamp of one request, and the metrics derived from them.

Raw events are readings of the one clock (engine/core/clock.py: `perf_counter_ns` of the server
process; the decode loop waits for the device before a stamp that claims work is done). Derived metrics use
the names of the metric glossary (ui/shell/glossary.py, the page's Glossary tab) and are computed, never stored, so they cannot
drift from the events. Each feature's figures are typed fields of `counters` (engine/core/counters.py),
the browser's timestamps arrive in `client`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from engine.core.clock import now_ns  # the one clock (re-exported: the engine's modules stamp through it)
from engine.core.counters import Counters


def peak_unit(dtype: str) -> str:
    """A matmul peak's unit (and its prefill_tflops'): integer products count operations, not floating-point
    ones. The machine's limits print it too (engine/measure/machine_limits.py)."""
    return "TOP/s" if dtype == "int8" else "TFLOP/s"


def _ms(start_ns: int | None, end_ns: int | None) -> float | None:
    if start_ns is None or end_ns is None:
        return None
    return (end_ns - start_ns) / 1e6


def _ratio(num, den, scale: float = 1.0):
    if num is None or not den:
        return None
    return num / den * scale


def _int_or_none(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
    batch_prompt_tokens: list[int] = field(default_factory=list)  # ...and prompt tokens (anyone's prefill) in it
    done_ns: int | None = None  # the engine finished (last token, stop, error or cancel)
    # A reply that opens with a thought (engine/core/thinking.py: a `<think>` block, or a server's
    # reasoning deltas): the sampling instants of its first thought token, of the token that closed
    # the thought, and of the first answer token (every reply has one once it shows visible text).
    thought_first_ns: int | None = None
    thought_end_ns: int | None = None
    answer_first_ns: int | None = None
    thought_tokens: int | None = None  # output tokens up to the one that closed it (None: no thought)
    # Token counts: None where unknown (a remote server that does not report them), never a guessed 0.
    prompt_tokens: int | None = 0
    prefill_tokens: int | None = 0  # prompt tokens actually computed (prompt_tokens - cached_tokens)
    cached_tokens: int | None = 0
    finish_reason: str | None = None  # stop | length | cancelled | error
    queue_position: int | None = None  # position in the queue when enqueued (0: ran at once)
    context_max: int | None = None  # the model's context window (None: the backend did not say)
    # The roofline's inputs (engine/measure/roofline.py), None where unknown: work done and the machine's limits.
    weight_bytes: int | None = None  # weights of the variant that served the request
    compute_dtype: str | None = None  # its prefill's matmul roof: the model's dtype, or int8 (integer kernels)
    prefill_flops: float | None = None
    decode_steps: int | None = None  # target forward passes after prefill
    decode_bytes: float | None = None  # weights + KV read over those steps
    kv_cache_dtype: str | None = None  # the KV cache's precision (the kv_cache_dtype toggle)
    kv_bytes_per_position: int | None = None  # what a position of context costs a decode step to read at it
    peak_tflops: float | None = None  # the machine's measured matmul peak for compute_dtype
    read_gbps: float | None = None  # the machine's measured memory read bandwidth: decode's roof
    copy_gbps: float | None = None  # the machine's measured memory copy bandwidth (for reference)
    limits_date: str | None = None
    limits_note: str | None = None  # a fraction above 100% of a limit: it is stale (engine/measure/roofline.py)
    # feature figures: the seed, the variant, the kernels, KV reuse, speculation, a remote's report...
    counters: Counters = field(default_factory=Counters)
    client: dict = field(default_factory=dict)  # browser timestamps and metrics, joined later
    # Work inside a stage, for the per-reply trace (engine/measure/trace.py): {"name", "start_ns",
    # "end_ns", **figures} — the KV lookup/copy and compile in setup, each prefill chunk, each
    # speculative step's drafted/accepted counts. Only what ran is recorded (absent, never zero).
    spans: list[dict] = field(default_factory=list)

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

    def add_span(self, name: str, start_ns: int, end_ns: int | None = None, **figures) -> int:
        """Record one piece of work inside a stage (ends now unless `end_ns`); returns its end."""
        end = now_ns() if end_ns is None else end_ns
        self.spans.append({"name": name, "start_ns": start_ns, "end_ns": end, **figures})
        return end

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
    def ttft_thought_ms(self):
        return _ms(self.received_ns, self.thought_first_ns)

    @property
    def thinking_ms(self):
        return _ms(self.thought_first_ns, self.thought_end_ns)

    @property
    def ttfa_ms(self):
        return _ms(self.received_ns, self.answer_first_ns)

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

    @property
    def prefill_tps(self):
        n, ms = self.prefill_tokens, self.prefill_ms
        return n / (ms / 1e3) if n and ms else None

    @property
    def context_tokens(self):
        return None if self.prompt_tokens is None else self.prompt_tokens + self.output_tokens

    @property
    def prefill_tflops(self):
        ms = self.prefill_ms
        return self.prefill_flops / (ms / 1e3) / 1e12 if self.prefill_flops and ms else None

    @property
    def prefill_compute_fraction(self):
        v = self.prefill_tflops
        return v / self.peak_tflops if v is not None and self.peak_tflops else None

    @property
    def decode_gbps(self):
        ms = self.decode_ms
        return self.decode_bytes / (ms / 1e3) / 1e9 if self.decode_bytes and ms else None

    @property
    def decode_bandwidth_fraction(self):
        v = self.decode_gbps
        return v / self.read_gbps if v is not None and self.read_gbps else None  # MachineLimits.decode_fraction

    @property
    def decode_bytes_per_token(self):
        n = self.output_tokens
        return self.decode_bytes / (n - 1) if self.decode_bytes and n > 1 else None

    def metrics(self) -> dict:
        """The glossary's scalar metrics (None where the events are missing)."""
        itl = self.itl_ms
        return {
            "queue_ms": self.queue_ms,
            "setup_ms": self.setup_ms,
            "prefill_ms": self.prefill_ms,
            "ttft_ms": self.ttft_ms,
            "ttft_thought_ms": self.ttft_thought_ms,
            "thinking_ms": self.thinking_ms,
            "ttfa_ms": self.ttfa_ms,
            "thought_tokens": self.thought_tokens,
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
            "prefill_tps": self.prefill_tps,
            "context_tokens": self.context_tokens,
            "context_max": self.context_max,
            "prefill_tflops": self.prefill_tflops,
            "prefill_compute_fraction": self.prefill_compute_fraction,
            "decode_gbps": self.decode_gbps,
            "decode_bandwidth_fraction": self.decode_bandwidth_fraction,
            "decode_bytes_per_token": self.decode_bytes_per_token,
        }

    # --- other tools' names for ours (the glossary's compatibility names: docs/api.md) ------------------------
    def llama_cpp_timings(self) -> dict:
        """llama.cpp server's `timings` fields, derived from this Timeline (None where unknown).

        `prompt_*` is prefill (the uncached prompt tokens, up to the first token sampled),
        `predicted_*` is every output token over the decode span (first → last token sampled);
        llama.cpp divides that span by all predicted tokens, so its per-token figure is a little
        below `tpot_ms`, which divides by the gaps (output_tokens − 1)."""
        prompt_n, prompt_ms = self.prefill_tokens, self.prefill_ms
        predicted_n, predicted_ms = (self.output_tokens or None), self.decode_ms
        spec = self.counters.speculation
        return {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": _ratio(prompt_ms, prompt_n),
            "prompt_per_second": _ratio(prompt_n, prompt_ms, 1e3),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": _ratio(predicted_ms, predicted_n),
            "predicted_per_second": _ratio(predicted_n, predicted_ms, 1e3),
            "cache_n": self.cached_tokens,
            "draft_n": _int_or_none(spec and spec.drafted),  # None: no speculation ran (llama.cpp omits them)
            "draft_n_accepted": _int_or_none(spec and spec.accepted),
        }

    def vllm_metrics(self) -> dict:
        """vLLM's per-request `metrics` object (docs/features/per_request_metrics.md in vLLM):
        its TTFT starts when the request is scheduled (our `started`), its queue time apart."""
        itl = self.itl_ms
        scheduled_to_last = _ms(self.started_ns, self.last_token_ns)
        return {
            "time_to_first_token_ms": _ms(self.started_ns, self.first_token_ns),
            "generation_time_ms": self.decode_ms,
            "queue_time_ms": self.queue_ms,
            "mean_itl_ms": statistics.fmean(itl) if itl else None,
            "tokens_per_second": _ratio(self.output_tokens or None, scheduled_to_last, 1e3),
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
                "thought_first": rel(self.thought_first_ns),
                "thought_end": rel(self.thought_end_ns),
                "answer_first": rel(self.answer_first_ns),
                "done": rel(self.done_ns),
            },
            "token_ms": [rel(t) for t in self.token_ns],
            "chunk_out_ms": [rel(t) for t in self.chunk_out_ns],
            "chunk_tokens": list(self.chunk_tokens),
            **({"batch_size": list(self.batch_size), "batch_prompt_tokens": list(self.batch_prompt_tokens)}
               if self.batch_size else {}),  # only when batching ran
            **({"spans_ms": [{**{k: v for k, v in s.items() if k not in ("start_ns", "end_ns")},
                              "start_ms": rel(s["start_ns"]), "end_ms": rel(s["end_ns"])} for s in self.spans]}
               if self.spans else {}),  # only where work inside a stage was recorded
            "received_ns": origin,
            "roofline": {"weight_bytes": self.weight_bytes, "compute_dtype": self.compute_dtype,
                         "prefill_flops": self.prefill_flops, "decode_steps": self.decode_steps,
                         "decode_bytes": self.decode_bytes, "peak_tflops": self.peak_tflops,
                         "peak_unit": peak_unit(self.compute_dtype) if self.compute_dtype else None,
                         "kv_cache_dtype": self.kv_cache_dtype, "kv_bytes_per_position": self.kv_bytes_per_position,
                         "read_gbps": self.read_gbps, "copy_gbps": self.copy_gbps,
                         "limits_date": self.limits_date, "limits_note": self.limits_note},
            "weight_bytes": self.weight_bytes,
            **self.counters.to_dict(),
            "client": dict(self.client),
        }

    def summary(self) -> str:
        """One line for a terminal: the numbers a person looks at first."""
        m = self.metrics()

        def n(v):
            return "?" if v is None else v

        def f(v, unit="ms", nd=0):
            return "n/a" if v is None else f"{v:,.{nd}f}{unit}"

        parts = [
            f"ttft {f(m['ttft_ms'])}",
            f"(queue {f(m['queue_ms'], nd=1)}, setup {f(m['setup_ms'], nd=1)}, prefill {f(m['prefill_ms'])})",
            *([f"thought at {f(m['ttft_thought_ms'])} for {f(m['thinking_ms'])}, answer at {f(m['ttfa_ms'])}"]
              if m["ttft_thought_ms"] is not None else []),
            f"tpot {f(m['tpot_ms'], nd=1)}",
            f"{f(m['decode_tps'], ' tok/s', 1)}",
            f"e2e {f(m['e2e_ms'])}",
            f"prompt {n(m['prompt_tokens'])} tok ({n(m['cached_tokens'])} cached)",
            f"prefill {f(m['prefill_tps'], ' tok/s', 1)} ({f(m['prefill_compute_fraction'] and 100 * m['prefill_compute_fraction'], '% of matmul peak')})",
            f"decode {f(m['decode_gbps'], ' GB/s', 1)} ({f(m['decode_bandwidth_fraction'] and 100 * m['decode_bandwidth_fraction'], '% of read bandwidth')})",
            f"output {m['output_tokens']} tok",
            f"finish {m['finish_reason']}",
        ]
        return " | ".join(parts)
