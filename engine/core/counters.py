"""A reply's counters: typed fields, each written by the module where its work happens, read by name.

`Counters` is the Timeline's `counters`. Its scalar fields belong to the local decode loop and the
worker; each feature that ran adds its group: `kv` (the prefix cache's lookup,
engine/serving/prefix_cache.py), `speculation` (engine/speculative/speculation.py), `network` (a remote
request's connection phases, engine/remote/network.py), `remote` (what a remote server reported and
how the reply arrived, engine/remote/). A group that did not run is None.

Names carry their unit: `_ms` milliseconds; a count is named by what it counts (`drafted` and
`accepted`: tokens; `forward_passes`, `backoffs`, `chunks`). An unknown value is None, never 0.

On the wire (`to_dict`, flat in the Timeline's JSON, the page's and the API's keys): each scalar
field that is known, and every field of each group that ran (None: ran, value unknown). The keys are
the field names; `from_dict` reads such a record back (a stored reply, another Latency Lab's).
No torch here: the page and the API import this without the decode loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass


@dataclass
class KvReuseCounters:
    """The prefix cache's part of a reply (`RequestReuse.counters`, engine/serving/request_reuse.py)."""

    kv_reuse: str | None = None  # off | session | shared | no_session: how the cache was asked
    kv_copy_ms: float | None = None  # copying the cached prefix's KV (None: the cache was not looked up)
    kv_handover: str | None = None  # taken | copied: the entry handed over whole, or its prefix copied
    kv_from: str | None = None  # "public_prefix": served from the chat template's shared preamble


@dataclass
class SpeculationCounters:
    """A speculative reply's figures (`Speculation.counters`, engine/speculative/speculation.py).
    A remote server's report fills `drafted`, `accepted` and `acceptance_rate` only."""

    speculative: str | None = None  # the mode: prompt_lookup | draft
    num_speculative_tokens: int | None = None  # k: the most tokens one step guesses
    drafted: int | None = None  # tokens proposed
    accepted: int | None = None  # proposed tokens the target accepted
    acceptance_rate: float | None = None  # accepted / drafted (None: nothing drafted)
    tokens_per_step: float | None = None  # output tokens per verify step
    accepted_hist: list[int] | None = None  # [m]: verify steps that accepted m guesses
    target_forward_passes: int | None = None
    draft_forward_passes: int | None = None
    draft_ms: float | None = None  # time spent proposing
    verify_ms: float | None = None  # time spent in verify passes
    backoffs: int | None = None  # times adaptive k fell to none
    k_changes: list[dict] | None = None  # the first few: {"token", "k", "acceptance_estimate"}
    k_change_count: int | None = None
    cost_model: dict | None = None  # CostModel.to_dict(): a verify's cost in plain steps
    draft_steps: list[list] | None = None  # [at, accepted, [drafted ids]] per verify (replay.py), the first few
    draft_step_count: int | None = None  # verify steps in all
    predicted_speedup: float | None = None  # tokens per plain-step cost (replay.py DraftLog)
    plain_step_ms: float | None = None  # the plain step the costs were measured against


@dataclass
class NetworkCounters:
    """A remote request's connection phases (`Phases.finish`, engine/remote/network.py); None where
    the phase did not happen (a reused connection opens nothing; an IP address needs no DNS)."""

    net_dns_ms: float | None = None
    net_connect_ms: float | None = None
    net_tls_ms: float | None = None
    net_send_ms: float | None = None
    net_headers_ms: float | None = None
    connection_reused: bool | None = None  # None: failed before its response headers


@dataclass
class RemoteCounters:
    """A reply measured at the client (engine/remote/client.py): what the server reported of itself
    (engine/remote/dialects.py) and how the reply arrived."""

    measured_at: str = "client"
    server_dialect: str | None = None  # which report was read: latency-lab, llama.cpp, vllm, tgi...
    server_queue_ms: float | None = None  # the server's own intervals, on its own clock
    server_ttft_ms: float | None = None
    server_prefill_ms: float | None = None
    server_decode_ms: float | None = None
    server_e2e_ms: float | None = None
    server_inference_ms: float | None = None
    server_output_tokens: int | None = None
    server_ttft_source: str | None = None
    server_timings: dict | None = None  # the server's raw timing fields, as sent
    completion_tokens: int | None = None  # usage.completion_tokens
    transport_overhead_ms: float | None = None  # client ttft − server ttft (network + client)
    response_headers_ms: float | None = None  # from received to the response headers read
    chunks: int | None = None  # streamed pieces with text


GROUPS = {"kv": KvReuseCounters, "speculation": SpeculationCounters, "network": NetworkCounters,
          "remote": RemoteCounters}


@dataclass
class Counters:
    seed: int | None = None  # the sampler's seed: the one asked for, or the one drawn (engine/serving/generate.py)
    decode_step: str | None = None  # "compiled": the compiled step served decode (None: eager)
    compile_ms: float | None = None  # setup: the compiled step built on CPU by this request
    capture_ms: float | None = None  # setup: CUDA graphs captured by this request
    forward_passes: int | None = None  # the target's forward passes, prefill chunks included (serving/decoding.py)
    quantization: str | None = None  # the weights variant that served (engine/serving/worker.py)
    variant_build_ms: float | None = None  # the variant built by this request
    batching: str | None = None  # batched | unbatched (why)
    max_batch: int | None = None
    kernels: dict | None = None  # {"prefill": ..., "decode": ...}: the projections' kernels (Plan.for_reply)
    thought_source: str | None = None  # where the reply's thought was read: text, or a server's field
    kv: KvReuseCounters | None = None
    speculation: SpeculationCounters | None = None
    network: NetworkCounters | None = None
    remote: RemoteCounters | None = None

    def to_dict(self) -> dict:
        """Flat, JSON-ready: the known scalars, and every field of each group that ran."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if is_dataclass(value):
                out.update(asdict(value))
            elif value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Counters:
        """A flat record (`to_dict`, or a whole Timeline dict) read back; keys of other things are ignored.
        A group is there when any of its keys is."""
        d = d or {}
        groups = {name: kind(**{f.name: d[f.name] for f in fields(kind) if f.name in d})
                  for name, kind in GROUPS.items() if any(f.name in d for f in fields(kind))}
        scalars = {f.name: d.get(f.name) for f in fields(cls) if f.name not in GROUPS}
        return cls(**scalars, **groups)
