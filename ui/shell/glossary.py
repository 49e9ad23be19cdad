"""The metric glossary as data: every number the page shows has a label, a unit,
the events it starts and ends at, which clock measured it, and which direction is better.

One source for the hover definitions in Python (tables, stats lines) and in the page's
JavaScript (overlays), which receives `as_json()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The smallest difference worth reporting between two configs (ui/compare/stats.py): B/A must move by at least
# FLOOR_REL and the difference be at least the metric's absolute floor, or the A/B verdict reads "no
# practical difference" however narrow its interval. Per unit here; a metric may declare its own.
FLOOR_REL = 0.02
FLOOR_ABS = {"ms": 1.0, "tok/s": 1.0, "tok": 1.0, "%": 0.01}  # 1 ms, 1 tok/s, 1 token, 1 point of a share
_FLOOR_WORDS = {"ms": "{:g} ms for times", "tok/s": "{:g} tok/s for speeds", "tok": "{:g} token for counts",
                "%": "{:g} point for shares"}


def floors_line() -> str:
    """The floors in words: "2%, and 1 ms for times, 1 tok/s for speeds, …"."""
    return f"{100 * FLOOR_REL:g}%, and " + ", ".join(
        _FLOOR_WORDS[u].format(100 * v if u == "%" else v) for u, v in FLOOR_ABS.items())


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str  # ms | s | tok | tok/s | req/s | % | B | MB | ratio | TFLOP/s | GB/s | ""
    start: str  # start event ("" for counts)
    end: str  # end event, or what is counted
    clock: str = "server"  # server | browser | both (a difference of two intervals) | estimated
    better: str = "lower"  # lower | higher | "" (no winner)
    headline: bool = False  # an A/B verdict sentence names it (ui/compare/verdict.py)
    floor_rel: float | None = None  # None: FLOOR_REL
    floor_abs: float | None = None  # None: FLOOR_ABS for its unit (0 where none)

    @property
    def floors(self) -> tuple[float, float]:
        """(relative, absolute): the smallest difference between two configs worth reporting."""
        rel = FLOOR_REL if self.floor_rel is None else self.floor_rel
        return rel, FLOOR_ABS.get(self.unit, 0.0) if self.floor_abs is None else self.floor_abs

    @property
    def hover(self) -> str:
        if self.start:
            text = f"{self.label} [{self.unit}]: from {self.start} to {self.end}"
        else:
            text = f"{self.label}: {self.end}"
        clock = {"server": "server clock", "browser": "browser clock",
                 "both": "browser interval minus server interval, each on its own clock",
                 "estimated": "across clocks: uses the estimated clock offset, ± its bound"}.get(self.clock, "")
        return f"{text} ({clock})" if clock else text


_M = Metric
METRICS: dict[str, Metric] = {m.name: m for m in [
    _M("queue_ms", "queue", "ms", "request enqueued", "worker starts it"),
    _M("setup_ms", "setup", "ms", "worker starts it", "prompt token ids ready and cache looked up"),
    _M("prefill_ms", "prefill", "ms", "prefill forward begins", "first token id sampled"),
    _M("ttft_ms", "TTFT (server)", "ms", "request received by the server", "first token id sampled", headline=True),
    _M("decode_ms", "decode", "ms", "first token sampled", "last token sampled"),
    _M("tpot_ms", "TPOT", "ms", "first token sampled", "last token sampled, divided by (output tokens − 1)",
       headline=True),
    _M("decode_tps", "decode speed", "tok/s", "first token sampled",
       "last token sampled: (output tokens − 1) per second", better="higher"),
    _M("e2e_ms", "total (server)", "ms", "request received", "last chunk handed to the transport", headline=True),
    _M("itl_p50_ms", "ITL p50", "ms", "token i−1 sampled", "token i sampled (median over the reply)"),
    _M("itl_max_ms", "longest gap", "ms", "token i−1 sampled", "token i sampled (the longest gap)"),
    _M("client_ttft_ms", "TTFT (browser)", "ms", "user pressed send", "first generated text painted", "browser"),
    _M("client_e2e_ms", "total (browser)", "ms", "user pressed send", "last text painted", "browser"),
    _M("transport_overhead_ms", "transport overhead", "ms", "",
       "TTFT (browser) − TTFT (server): network in + out + render for the first token", "both"),
    _M("network_in_ms", "network in", "ms", "user pressed send",
       "request received by the server (with a simulated Network, its one-way delay is in here)", "estimated"),
    _M("network_out_ms", "network out + paint", "ms", "first token id sampled",
       "first text painted (with a simulated Network, its one-way delay is in here; with streaming off, the "
       "whole reply's generation too)", "estimated"),
    _M("paint_lag_ms", "paint lag (last)", "ms", "last token sampled", "last text painted", "estimated"),
    _M("prompt_tokens", "prompt", "tok", "", "tokens in the prompt", better=""),
    _M("prefill_tokens", "prefilled", "tok", "", "prompt tokens computed by prefill (not cached)"),
    _M("cached_tokens", "cached", "tok", "", "prompt tokens served from the prefix cache (not prefilled)",
       better="higher"),
    _M("output_tokens", "output", "tok", "", "tokens generated", better=""),
    _M("drafted", "drafted", "tok", "", "tokens proposed by speculation", better=""),
    _M("accepted", "accepted", "tok", "", "proposed tokens the target accepted", better="higher"),
    _M("acceptance_rate", "acceptance", "%", "", "accepted / drafted", better="higher"),
    _M("tokens_per_step", "tokens/step", "tok", "", "output tokens per target forward pass", better="higher"),
    _M("weight_mb", "weights", "MB", "", "bytes of the model variant's weights", better="lower"),
    # The roofline (engine/measure/roofline.py): each stage against the machine's measured limit.
    _M("prefill_tps", "prefill rate", "tok/s", "prefill forward begins",
       "first token sampled: prefill tokens / prefill_ms (prompt processing rate)", better="higher"),
    _M("context_tokens", "context used", "tok", "", "prompt + output tokens of this request", better=""),
    _M("context_max", "context window", "tok", "", "the model's context window (most tokens it can attend to)",
       better=""),
    _M("prefill_tflops", "prefill compute", "TFLOP/s", "prefill forward begins",
       "first token sampled: (2 × layer matmul parameters × prefill tokens + 2 × lm_head parameters "
       "+ attention FLOPs 4 × layers × heads × head_dim × keys attended) / prefill_ms. A w8a variant's prefill "
       "runs these multiply-adds as integer dot products: the same count, shown beside its int8 peak in TOP/s",
       better="higher"),
    _M("prefill_compute_fraction", "prefill % of matmul peak", "%", "",
       "prefill_tflops / peak_tflops, the machine's measured matmul peak for that dtype (1 = compute-bound at "
       "the roof)", better="higher"),
    _M("decode_gbps", "decode bandwidth", "GB/s", "first token sampled",
       "last token sampled: (weight bytes + KV bytes read per step) × steps / decode time", better="higher"),
    _M("decode_bandwidth_fraction", "decode % of read bandwidth", "%", "",
       "decode_gbps / read_gbps, the machine's measured memory read bandwidth: a decode step reads its weights "
       "and KV and writes next to nothing, so reading is its roof (1 = memory-bound at the roof). The same "
       "division in the page, the API's timings and `python -m engine.bench bandwidth`. Above 100% it is not "
       "shown: the limit is stale (probed while the machine was busy; the engine re-measures it when idle and "
       "says 'limit re-measured'), or the step's bytes fit in the cache", better="higher"),
    # The machine's limits (engine/measure/machine_limits.py): one probe per machine and device, cached with its
    # date; every fraction above divides by one of them. Each is the best of interleaved rounds spread over the
    # probe (a busy moment only slows a round), with the rounds' spread (best − worst) / best recorded beside it.
    _M("read_gbps", "read bandwidth (limit)", "GB/s", "",
       "the machine's memory read bandwidth: the faster of torch.sum and (on CPU, where our kernels run) our fp32 "
       "one-row product over a buffer 8× the last-level cache (≥ 256 MiB; 1 GiB on CUDA), all threads, bytes read "
       "per second; the best of interleaved rounds (a busy moment only slows a round; the rounds' spread is kept "
       "beside it); decode_bandwidth_fraction divides by it", better=""),
    _M("copy_gbps", "copy bandwidth (limit)", "GB/s", "",
       "the machine's memory copy bandwidth, for reference: dst.copy_(src) on two such buffers, bytes read + "
       "written per second (STREAM's convention); no fraction divides by it", better=""),
    _M("peak_tflops", "matmul peak (limit)", "TFLOP/s", "",
       "the machine's matmul throughput in the reply's compute dtype: torch.mm of N×N matrices, 2·N³ FLOP per "
       "product, N grown until one takes ≥ 20 ms; the best of interleaved rounds; prefill_compute_fraction "
       "divides by it. A variant whose prefill runs integer dot products (int8 activations: int8w8a, int4w8a) "
       "is held to the int8 peak instead: torch._int_mm, 2·N³ operations per product (TOP/s)", better=""),
    _M("decode_mb_per_token", "bytes per token", "MB", "",
       "bytes decode read per output token: (weight bytes + KV bytes) × steps / (output tokens − 1)",
       better="lower"),
    _M("kv_bytes_per_position", "KV per token of context", "B", "",
       "bytes one position of context costs a decode step to read: 2 (K and V) × layers × KV heads × head_dim × "
       "the cache's element size (kv_cache_dtype: the model's dtype, 2 for fp16/bf16, 1 for int8 plus a 4-byte "
       "scale per head per position); decode_gbps counts it at every step's context. fp16, bf16 and int8 are "
       "lossy: greedy replies are not promised to match the model-dtype cache (bench kv --kv-dtypes measures "
       "the agreement)", better="lower"),
    _M("compile_ms", "compile", "ms", "the request's setup asks for the compiled step (compiled_decode)",
       "its graph built and checked against the eager step (first request per weights variant; part of setup_ms)"),
    _M("capture_ms", "graph capture", "ms", "the request's setup asks for the compiled step on a GPU",
       "its decode step's CUDA graphs captured for the request's KV bucket (first request per bucket and weights "
       "variant; part of setup_ms), checked against the uncaptured step the first time"),
    _M("batch_size", "batch size", "", "",
       "sequences in the forward that produced token i (continuous batching, --max-batch; 1: alone)", better=""),
    _M("batch_prompt_tokens", "prompt tokens in the forward", "tok", "",
       "prompt tokens (any request's prefill) in the forward that produced token i (continuous batching): "
       "they cost nearly as much batched as alone", better=""),
    _M("with_prompt_share", "tokens beside a prefill", "%", "",
       "decode tokens (i ≥ 1) whose forward carried prompt tokens: batch_prompt_tokens[i] > 0", better=""),
    _M("itl_ms_with_prompt_p50", "ITL p50 beside a prefill", "ms", "token i−1 sampled",
       "token i sampled, over decode tokens whose forward carried prompt tokens (median)"),
    _M("itl_ms_decode_only_p50", "ITL p50, decode-only forwards", "ms", "token i−1 sampled",
       "token i sampled, over decode tokens whose forward carried no prompt tokens (median)"),
    # Two configs compared over items (ui/compare/stats.py, ui/compare/replies.py): the Sweep and repeated A/B runs.
    _M("ab_ratio", "B / A", "ratio", "",
       "each item's B over its own A, averaged in logs (a geometric mean), the A-first and the B-first items "
       "weighted equally so an order effect cancels (below 1: B is lower)", "", better=""),
    _M("ab_ratio_ci", "95% interval", "ratio", "",
       "the 95% confidence interval of B / A: a t-interval on log(B / A), order-adjusted (df = items − 2), at "
       "every size: a bootstrap covers less often than it claims at the sizes a page runs (`python -m "
       "ui.compare.coverage` measures it)", "", better=""),
    _M("ab_p_holm", "p (Holm)", "", "",
       "the chance of a difference at least this large if A and B were the same, corrected for the table's "
       "metrics tested at once (Holm's step-down): a side can win only where it is at most α (stated under the "
       "table)", "",
       better=""),
    _M("ab_decision", "decision", "", "",
       "the better side, only where p (Holm) ≤ α and B / A moves by at least the metric's practical floors; "
       "inside them 'no practical difference'; otherwise 'no difference detected (n = items)'", "", better=""),
    _M("items_to_detect_5pct", "items for 5%", "", "",
       "items a counterbalanced t-test on log(B / A) needs to detect a 5% difference (80% power, exact "
       "noncentral t) at the spread of log(B / A) observed here, at α / the metrics tested (the correction's "
       "strictest step)", "", better=""),
    _M("practical_floor", "practical floor", "", "",
       "the smallest difference worth reporting, declared once with the metrics (ui/shell/glossary.py): B / A must "
       "move by at least the relative floor and the difference be at least the absolute one (" + floors_line()
       + "); a decided difference inside either floor reads 'no practical difference'", "",
       better=""),
    _M("holm_correction", "Holm correction", "", "",
       "testing many metrics at once finds some 'difference' by chance; Holm's step-down procedure sorts the "
       "p-values and compares the smallest with α / m, the next with α / (m − 1), …, stopping at the first that "
       "fails, so the chance that a whole table names any false winner stays at most α", "", better=""),
    _M("order_counterbalanced", "counterbalanced order", "", "",
       "which config runs first alternates pair by pair (ABBA: AB, BA, BA, AB, …; in each sweep item, each "
       "repeated A/B pair; recorded as `order` in the exports): whatever the first run of a pair warms up "
       "(caches, the allocator) helps A and B alike; the order effect (the second run over the first) is "
       "measured and taken out of B / A", "", better=""),
    _M("warmup_pair", "warm-up pair", "", "",
       "the first pair of a run (a sweep's extra first item, the first A/B pair of a prompt): shown and "
       "exported (`warmup`), not counted, because one-time costs land in it (a weights variant built, a "
       "compile, first-touch memory)", "", better=""),
    _M("aa_check", "A/A check", "", "",
       "the Sweep run with B set to A's settings: every metric should read 'no difference'. A winner there is a "
       "false positive, so the machine or the method is too noisy to trust an A/B at that size; by design it "
       "happens in at most α (5%) of A/A checks", "", better=""),
    _M("identical_replies", "identical replies", "", "",
       "pairs whose token ids are the same in A and B; where one differs, its first differing token. Lossless "
       "toggles (declared in engine/core/toggles.py: KV reuse, speculation, chunked prefill, the compiled step; "
       "batching too) must keep greedy fp32 replies identical", better="higher"),
    _M("token_agreement", "token agreement with A", "%", "",
       "over the set: B's tokens equal to A's before the pair's replies first differ, / A's tokens (the quality "
       "delta of a lossy change: a weights variant, bf16, sampling)", better="higher"),
    _M("identical_rate", "identical-reply rate", "%", "", "identical replies / pairs compared", better="higher"),
    _M("ttft_attribution", "TTFT change, attributed", "ms", "A's TTFT",
       "B's TTFT, split into measured terms that add up: prefill tokens avoided × the measured prefill cost per "
       "token, the rest of the prefill change, queue, setup (KV copy, compile, variant build), gaps between "
       "stages, and network (browser TTFT − server TTFT)", "both"),
    _M("whatif_ttft_ms", "what-if TTFT", "ms", "request received", "first token sampled, predicted for another "
       "prompt length, weights variant or batch size: a pass = one read of the weights (this reply's TPOT, or weight "
       "bytes / the measured read bandwidth) + the extra rows' FLOPs at the rate this reply's prefill reached (or "
       "the measured matmul peak); queue, setup and gaps as measured (engine/measure/whatif.py)", "estimated"),
    _M("whatif_error", "what-if error", "%", "", "predicted / measured − 1, the prediction made from the first "
       "reply at the prompt length that really ran", better=""),
    # Speculation replayed (engine/speculative/replay.py, ui/insight/replay.py).
    _M("acceptance_by_position", "acceptance by draft position", "%", "",
       "for draft position j: of the verifies that drafted at least j tokens, the share whose j-th guess the "
       "target accepted (guesses after a rejected one never count as accepted)", better="higher"),
    _M("predicted_speedup", "predicted speedup", "ratio", "",
       "decode tokens / their cost in plain decode steps, each verify of k guesses priced by the measured cost "
       "table (engine/speculative/costs.py: verify(k + 1), plus k draft tokens for a draft model) and each plain "
       "step at 1: what this reply's measured acceptance should give against plain decoding", better="higher"),
    _M("measured_speedup", "measured speedup", "ratio", "",
       "a plain decode step's time / this reply's TPOT; the plain step is the median of this reply's own plain "
       "steps (tokens no verify produced, the same machine load), else the one the cost calibration measured in "
       "this process; below 1: speculation cost time", better="higher"),
    _M("rejected_drafts", "rejected drafts", "tok", "", "drafted tokens the target did not accept (drafted − accepted)",
       better="lower"),
    # Perceived latency (ui/chat/perceived.py): what the reader sees, on the browser's clock.
    _M("client_feedback_ms", "first feedback", "ms", "user pressed send",
       "the message and a status painted (Nielsen's 'instant' is 100 ms)", "browser"),
    _M("client_status_ms", "server status seen", "ms", "user pressed send",
       "the server's first status (queued / processing the prompt) painted", "browser"),
    _M("client_first_word_ms", "first word", "ms", "user pressed send", "the reply's first whole word painted",
       "browser"),
    _M("paint_gap_cv", "word-gap CV", "ratio", "a word of the reply painted",
       "the next word painted: the spread of those gaps, standard deviation / mean (0 = perfectly even; "
       "words painted together are gaps of 0)", "browser"),
    _M("paint_gap_max_ms", "longest stall", "ms", "a word of the reply painted",
       "the next word painted (the longest such gap)", "browser"),
    _M("reader_wait_ms", "reader wait", "ms", "first text painted",
       "last text painted: the time a reader at the reading pace spends waiting for more text", "browser"),
    _M("smoothing_hold_ms", "smoothing hold", "ms", "the last text arrived",
       "it was put on the page (what smoothing held back at the end; 0 when off)", "browser"),
    # The per-reply trace's pieces (engine/measure/trace.py, docs/trace.md): its slices' names and args.
    _M("kv_copy_ms", "KV copy", "ms", "the prefix cache's matching entry found",
       "its KV copied (or handed over) into the request's cache (part of setup_ms; the trace's 'kv lookup')"),
    _M("prefill_chunk_ms", "prefill chunk", "ms", "a chunk of the prompt handed to the forward (batched: "
       "waiting for the batch's forward included)", "its prompt tokens are in the KV cache (the trace's 'prefill chunk')"),
    _M("decode_step_ms", "decode step", "ms", "token i−1 sampled",
       "the next token(s) sampled: one step, several tokens when speculation's guesses were accepted "
       "(the trace's 'decode step', with its batch size, kernels, drafted and accepted)"),
    _M("network_out_chunk_ms", "network out (chunk)", "ms", "a chunk handed to the transport",
       "that chunk read by the browser (the trace's 'network out'; the simulated link's delay is in it)", "estimated"),
    _M("clock_bound_ms", "clock offset bound", "ms", "",
       "half the round trip of the clock ping the offset came from: every cross-clock time is within ± this"),
    # the Load tab's open loop (server/load/serve_figures.py; vLLM's `bench serve` names), the load clients' clock
    _M("request_rate", "offered rate", "req/s", "",
       "requests per second the open-loop clients send (Poisson, gamma with the burstiness as shape, or constant "
       "gaps), whether or not the earlier ones have finished", "", better=""),
    _M("request_throughput", "request throughput", "req/s", "",
       "completed requests ÷ the level's duration (first send to last reply)", "", better="higher"),
    _M("output_throughput", "output throughput", "tok/s", "",
       "output tokens of the completed requests ÷ the level's duration", "", better="higher"),
    _M("request_goodput", "goodput", "req/s", "",
       "completed requests whose every objective holds (--goodput ttft, tpot, e2el in ms; a one-token reply "
       "meets TPOT) ÷ the level's duration, as vLLM's request_goodput", "", better="higher"),
    _M("output_throughput_per_user", "tok/s per user", "tok/s", "",
       "median over completed requests of 1000 ÷ TPOT (load client's clock): how fast one reply reads once it "
       "has started; the Pareto plot's y against output throughput", "", better="higher"),
    _M("knee", "knee", "req/s", "",
       "the lowest offered rate whose goodput is within 5% of the sweep's best: past it, more traffic buys no "
       "more requests served within the objectives, only longer queues", "", better=""),
    _M("e2el_ms", "E2E latency (load client)", "ms", "the load client sends the request", "its stream ended", ""),
    # Thinking vs answering (engine/core/thinking.py): a reply that opens with a thought, a `<think>` block in its
    # text or a server's reasoning deltas (kept in the text, marked). Chunks are placed at their last token's sampling.
    _M("ttft_thought_ms", "TTFT (first thought)", "ms", "request received by the server",
       "the first token of the reply's opening thought sampled (null: the reply opens with no thought)"),
    _M("thinking_ms", "thinking", "ms", "the first thought token sampled",
       "the token that closed the thought sampled (`</think>`, or the first delta after the reasoning; null: no "
       "thought, or one that never closed)"),
    _M("ttfa_ms", "TTFA (time to first answer)", "ms", "request received by the server",
       "the first token of visible answer text sampled, after the thought (a reply with no thought: its first "
       "visible token, so about TTFT)"),
    _M("thought_tokens", "thought tokens", "tok", "",
       "output tokens up to the one that closed the thought, tags included (every token when it never closed)",
       better=""),
    _M("thought_source", "thought read from", "", "",
       "text: a `<think>` block in the reply; else the server's field that carried it (reasoning_content, "
       "reasoning, thinking)", better=""),
    _M("client_ttft_thought_ms", "first thought (browser)", "ms", "user pressed send",
       "the thought's first visible character painted", "browser"),
    _M("client_thinking_ms", "thinking (browser)", "ms", "the thought's first visible character painted",
       "its closing tag painted", "browser"),
    _M("client_ttfa_ms", "TTFA (browser)", "ms", "user pressed send",
       "the answer's first visible character painted", "browser"),
    # A remote request's network phases (engine/remote/network.py), on this machine's clock: sub-stages of its
    # network in. Only phases that ran have a value: a reused connection has no DNS, connect or TLS (null).
    _M("net_dns_ms", "DNS", "ms", "a new connection's host name looked up",
       "its addresses returned (null: no new connection, or the host is an IP address)"),
    _M("net_connect_ms", "connect", "ms", "the addresses known (or the connect began)",
       "the TCP connection established (null: a kept-alive connection served the request)"),
    _M("net_tls_ms", "TLS handshake", "ms", "the TCP connection established",
       "the TLS handshake done (https only; null: reused, or plain http)"),
    _M("net_send_ms", "request sent", "ms", "the request's headers start to be written", "its body written"),
    _M("net_headers_ms", "response headers", "ms", "the request written",
       "the response's headers read: the server's time to answer, plus a round trip"),
    _M("connection_reused", "connection reused", "", "",
       "true when the request opened no connection (a kept-alive one served it: no DNS, connect or TLS)",
       better=""),
    # KV reuse under load (server/load/reuse.py): multi-turn conversations with think time, per load level.
    _M("think_time_s", "think time", "s", "a client's reply ended",
       "it sends its conversation's next turn (drawn per turn from the run's distribution, around its mean)",
       better=""),
    _M("kv_budget_mb", "KV budget", "MB", "", "the prefix cache's budget during the run (MiB)", better=""),
    _M("follow_up_reuse_rate", "history reused", "%", "",
       "follow-up turns (KV reuse on, in a session) whose cached tokens cover the previous turn's prompt, all but "
       "its last token (their conversation's KV survived the think time), / such follow-up turns", better="higher"),
    _M("prefix_hit_rate", "prefix-cache hit rate", "%", "",
       "prompt tokens served from the prefix cache / prompt tokens looked up during the level (vLLM's definition; "
       "the chat template's shared preamble counts)", better="higher"),
    _M("kv_evictions", "evictions", "", "",
       "entries the prefix cache evicted (least recently used first) to make room during the level", better="lower"),
    _M("kv_rejected", "refused", "", "",
       "entries the prefix cache could not keep during the level (larger than its budget, or the room held by "
       "running requests)", better="lower"),
    _M("kv_peak_mb", "KV peak", "MB", "", "the prefix cache's largest size sampled during the level (MiB, every "
       "0.25 s)", better=""),
    _M("follow_ups", "follow-ups", "", "", "follow-up turns (turn 2 and on) completed in the level, in conversations "
       "that can reuse (KV reuse on, in a session)", better=""),
    _M("follow_up_ttft_ratio", "follow-up / first-turn TTFT", "ratio", "",
       "p50 server TTFT of follow-up turns / p50 of first turns: near 1 while reuse holds (only new tokens are "
       "prefilled), growing with the history once it collapses (the whole history prefilled again)"),
    _M("first_turn_ttft_ms_p50", "first-turn TTFT p50", "ms", "request received by the server",
       "first token sampled: p50 over a run's first turns (conversations that can reuse)"),
    _M("follow_up_ttft_ms_p50", "follow-up TTFT p50", "ms", "request received by the server",
       "first token sampled: p50 over a run's follow-up turns (turn 2 and on, conversations that can reuse)"),
    # This browser's paint limit (ui/chat/stress.js): the Chat tab's stress run, per rate; browser clock.
    _M("stress_rate", "rate", "tok/s", "", "the paced test source's rate for this row of the stress run", "browser",
       better=""),
    _M("stress_tokens", "tokens", "tok", "", "tokens of the long markdown reply streamed at this rate (at most 20 s "
       "of them)", "browser", better=""),
    _M("stress_lag_p50_ms", "paint lag p50", "ms", "the server sampled a chunk's last token (placed on the browser's "
       "axis through the clock offset)", "the browser painted that chunk: the median over the reply's chunks",
       "estimated"),
    _M("stress_lag_p99_ms", "paint lag p99", "ms", "the server sampled a chunk's last token (browser axis)",
       "the browser painted that chunk: the 99th percentile; over 50 ms (or growing over the reply) the page has "
       "fallen behind at this rate", "estimated"),
    _M("stress_long_tasks", "long tasks", "", "", "main-thread tasks of 50 ms or more during the reply "
       "(PerformanceObserver 'longtask')", "browser"),
    _M("stress_long_task_ms", "in long tasks", "ms", "the reply's first long task began",
       "its last ended: the summed duration of the long tasks", "browser"),
    _M("stress_markdown_ms_per_chunk", "markdown / update", "ms", "a text update begins",
       "the markdown renderer has parsed the open tail into detached nodes: mean per update", "browser"),
    _M("stress_dom_ms_per_chunk", "DOM / update", "ms", "the nodes are parsed",
       "the page's DOM holds them (old tail removed, new nodes in, the thought fold): mean per update", "browser"),
    _M("stress_cost_growth", "late / early cost", "ratio", "",
       "mean render cost (markdown + DOM) of the last quarter of the reply's updates / that of the first quarter: "
       "about 1 when an update costs the same however long the reply is", "browser"),
    _M("stress_dropped_frames", "dropped frames", "", "",
       "animation frames missed during the reply (a gap of k frame times, at 60 Hz, missed k - 1)", "browser"),
]}


# Other tools' names for ours (docs/api.md): what the API also answers under their names
# (Timeline.llama_cpp_timings / vllm_metrics) and what engine/remote/dialects.py reads from their servers.
FOREIGN: dict[str, dict[str, str]] = {
    "llama.cpp timings": {"prompt_n": "prefill_tokens", "prompt_ms": "prefill_ms", "predicted_n": "output_tokens",
                          "predicted_ms": "decode_ms", "cache_n": "cached_tokens", "draft_n": "drafted",
                          "draft_n_accepted": "accepted"},
    "vLLM metrics": {"queue_time_ms": "queue_ms", "time_to_first_token_ms": "worker starts it → first token (ttft_ms minus the wait)",
                     "generation_time_ms": "decode_ms", "mean_itl_ms": "mean of itl_ms"},
    "Ollama": {"prompt_eval_count": "prefill_tokens", "prompt_eval_duration": "prefill_ms",
               "eval_count": "output_tokens", "eval_duration": "decode_ms", "total_duration": "e2e_ms"},
    "TGI headers": {"x-queue-time": "queue_ms", "x-prompt-tokens": "prompt_tokens",
                    "x-generated-tokens": "output_tokens"},
}


def hover(name: str) -> str:
    m = METRICS.get(name)
    return m.hover if m else name


def as_json() -> dict:
    """For the page's JavaScript: {name: {label, unit, hover, better, ...}}."""
    return {name: {**asdict(m), "hover": m.hover} for name, m in METRICS.items()}
