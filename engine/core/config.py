"""Options: how to load a model (`LoadConfig`) and how to answer one request (`GenerationConfig`).

Both are plain dataclasses. Each `GenerationConfig` field is declared once, with its bounds, as a
`toggle(...)` (engine/core/toggles.py); making a `GenerationConfig` checks every field against its
declaration and turns every bad value into an `InvalidRequest` whose message says which field is
wrong and what would be accepted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from engine.core.errors import InvalidRequest
from engine.core.toggles import declared, toggle

DTYPES = ("auto", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
SPECULATIVE_MODES = ("off", "prompt_lookup", "draft")
# The KV cache's precision (the kv_cache_dtype toggle): "model" keeps keys and values in the model's dtype
# (the default, and the only lossless choice on an fp32 model); fp16 and bf16 store them in 16 bits; int8
# in 8 bits with one fp32 scale per head per position (engine/model/kv_cache.py). The lossy choices are
# named here once: the greedy-identity tests exclude exactly these, and the page says so.
KV_CACHE_DTYPES = ("model", "fp16", "bf16", "int8")
LOSSY_KV_CACHE_DTYPES = ("fp16", "bf16", "int8")
MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 200
# Chunked prefill's default chunk: the smallest that costs little more than one forward (shorter
# chunks make matmuls less efficient per row; 512 was no cheaper on one thread) while the bar still moves
# several times on a long prompt. Chunking is off by default: where threads fight for cores every
# forward pays a fixed cost. `python -m engine.bench prefill_chunks` prints each chunk's cost
# (figures: docs/perceived-latency.md, docs/history.md).
PREFILL_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class LoadConfig:
    """How the engine loads its model. Paths come only from here (the command line), never a request."""

    model: str | None = None  # None: the bundled SmolLM2-135M-Instruct; else a folder, a .gguf file or a hub id
    dtype: str = "auto"  # auto picks what measured fastest for the device (see loader.resolve_dtype)
    device: str = "auto"
    threads: int | None = None  # torch intra-op threads on CPU; None keeps torch's default
    cache_dir: Path | None = None  # where converted weights are kept; default: per-user cache folder
    fast_path: bool = True  # our own Llama-family forward; False forces the generic transformers forward
    progress: bool = True  # show a progress bar while loading
    kv_cache_mb: float | str = "auto"  # prefix cache (KV reuse) budget in MiB; 0 keeps nothing; auto: engine/serving/kv_budget.py
    shared_prefix_cache: bool = False  # one prefix-cache scope for all sessions (default: per session)
    variants: tuple[str, ...] = ()  # quantization variants to build at start (others: on first use)
    variants_budget_mb: float | None = None  # weights of all resident variants; None: 3x the loaded model's
    draft_model: str | None = None  # speculative draft: a folder sharing the tokenizer; None: bundled (if any)
    max_batch: int = 1  # continuous batching: sequences decoded together in one forward; 1: one request at a time

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise InvalidRequest(f"--dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}", "dtype")
        if self.device not in DEVICES:
            raise InvalidRequest(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}", "device")
        if self.kv_cache_mb != "auto" and (isinstance(self.kv_cache_mb, bool) or not isinstance(self.kv_cache_mb, (int, float))
                                           or not 0 <= self.kv_cache_mb < 2**40):
            raise InvalidRequest(f"--kv-cache-mb must be auto or a number of MiB >= 0, not {self.kv_cache_mb!r}", "kv_cache_mb")
        if self.threads is not None and not (1 <= self.threads <= 1024):
            raise InvalidRequest(f"--threads must be a positive integer, not {self.threads!r}", "threads")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or not 1 <= self.max_batch <= 256:
            raise InvalidRequest(f"--max-batch must be an integer from 1 to 256, not {self.max_batch!r}", "max_batch")
        if self.variants_budget_mb is not None and not self.variants_budget_mb > 0:
            raise InvalidRequest(f"--variants-budget-mb must be positive, not {self.variants_budget_mb!r}",
                                 "variants_budget_mb")


@dataclass(frozen=True)
class GenerationConfig:
    """Per-request options: sampling, stopping, and the optimization toggles."""

    # Sampling: each field is its one declaration; the page's panes start some of them elsewhere (their
    # named overrides in ui/chat/settings.py). No upper bound on max_new_tokens: the model's context is one
    # (a request past it is refused as context_length_exceeded), and the page's slider ends there.
    max_new_tokens: int = toggle(
        256, "int", "Max tokens", "the most tokens the reply may have", lo=1, step=1, sampling=True)
    temperature: float = toggle(  # SmolLM2's model card suggests 0.2 with top-p 0.9
        0.2, "float", "Temperature", "0 = greedy", lo=0.0, hi=2.0, step=0.05, sampling=True)
    top_p: float = toggle(
        0.9, "float", "Top-p", "sample among the most likely tokens whose probabilities add up to this",
        lo=0.0, lo_open=True, hi=1.0, step=0.05, sampling=True)
    top_k: int = toggle(
        0, "int", "Top-k", "sample among this many most likely tokens; 0 = no cut", lo=0, sampling=True, page=False)
    seed: int | None = toggle(
        None, "int", "Seed", "same seed, same output; none given: random", lo=0, hi=2**63 - 1, sampling=True)
    stop: tuple[str, ...] = toggle(
        (), "strings", "Stop strings", "end the reply before this text (repeatable)", hi=MAX_STOP_STRINGS,
        max_chars=MAX_STOP_CHARS, sampling=True, page=False)
    # The optimization toggles: each field below is the toggle's one declaration (engine/core/toggles.py).
    kv_reuse: bool = toggle(
        True, "bool", "KV reuse", "serve the longest cached prefix of the prompt from the prefix cache; "
        "prefill only the rest", glossary="cached_tokens")
    speculative: str = toggle(
        "off", "choice", "Speculation", "guess several tokens per step and verify them in one forward: "
        "prompt_lookup copies n-grams from the prompt, draft asks a small draft model",
        choices=SPECULATIVE_MODES, glossary="tokens_per_step")
    num_speculative_tokens: int = toggle(
        4, "int", "Draft tokens (k)", "the most tokens one speculative step guesses", lo=1, hi=16,
        glossary="drafted", only_with="speculative", short="k")
    speculative_adaptive: bool = toggle(
        True, "bool", "Adaptive k", "guess fewer tokens (or none) while guesses stop paying",
        glossary="acceptance_rate", off_label="fixed k", only_with="speculative")
    quantization: str | None = toggle(
        None, "variant", "Weights", "the weights variant that serves the request (a dtype or a "
        "quantization); none: the variant the engine loaded", glossary="weight_mb", lossless=False)
    chunked_prefill: bool = toggle(
        False, "bool", "Chunked prefill", "prefill long prompts in chunks: a progress bar and Stop between "
        "chunks, for some extra prefill time", glossary="prefill_ms")
    prefill_chunk_tokens: int = toggle(
        PREFILL_CHUNK_TOKENS, "int", "Chunk tokens", "prompt tokens per prefill chunk (with chunked prefill)",
        lo=16, hi=65536, glossary="prefill_ms", only_with="chunked_prefill", short="chunk")
    compiled_decode: bool = toggle(
        False, "bool", "Compiled step", "decode each token through one graph of the whole step, not ~900 "
        "separate calls: on CPU torch.compile fuses the glue around the matmuls (pays with int4/int8 weights; "
        "the first request per weights variant compiles it, tens of seconds); on a GPU CUDA graphs replay it "
        "(captured in milliseconds; such requests batch)", glossary="tpot_ms")
    kv_cache_dtype: str = toggle(
        "model", "choice", "KV cache", "the precision keys and values are kept in: model (the model's dtype), "
        "fp16, bf16, or int8 with one scale per head per position; a decode step reads the whole cache, so past "
        "a long prompt a smaller cache reads less. Lossy: fp16, bf16 and int8 round the keys and values, so greedy "
        "replies are not promised to match the model-dtype cache token for token (bench kv --kv-dtypes measures "
        "the agreement)", choices=KV_CACHE_DTYPES, glossary="kv_bytes_per_position", lossless=False, short="kv")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes) -> GenerationConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def __post_init__(self):
        """Raise InvalidRequest for any value the engine cannot honour: the one validation, where a
        config is made, so an invalid one never exists (the API, the page, the CLI and a remote engine
        all build one; none checks again)."""
        for t in (*SAMPLING, *TOGGLES):
            t.check(getattr(self, t.name))
        if self.compiled_decode and self.speculative != "off":
            raise InvalidRequest("compiled_decode compiles the plain one-token step; speculation verifies several "
                                 "tokens per forward, which it does not cover: turn one of them off", "compiled_decode")
        if self.compiled_decode and self.kv_cache_dtype != "model":
            raise InvalidRequest("compiled_decode's graph reads a KV cache in the model's dtype; kv_cache_dtype="
                                 f"{self.kv_cache_dtype} runs the eager step: turn one of them off", "kv_cache_dtype")


TOGGLES = declared(GenerationConfig)  # the page, API, CLI and remote engine derive from these
TOGGLE = {t.name: t for t in TOGGLES}
SAMPLING = declared(GenerationConfig, sampling=True)  # and from these
FIELD = {t.name: t for t in (*SAMPLING, *TOGGLES)}  # every declared GenerationConfig field


def parse_kv_cache_mb(text: str) -> float | str:
    """--kv-cache-mb's value: 'auto' (engine/serving/kv_budget.py sizes it from the device) or MiB >= 0."""
    import argparse

    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 2**40:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a number of MiB >= 0, not {text!r}")
    return value
