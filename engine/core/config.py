"""Options: how to load a model (`LoadConfig`) and how to answer one request (`GenerationConfig`).

Both are plain dataclasses. `GenerationConfig.validate` turns every bad value into an
`InvalidRequest` whose message says which field is wrong and what would be accepted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from engine.core.errors import InvalidRequest
from engine.core.toggles import declared, toggle

DTYPES = ("auto", "bf16", "fp16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
SPECULATIVE_MODES = ("off", "prompt_lookup", "draft")
MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 200
# Chunked prefill's default chunk. A 1,500-token bf16 prefill on the 2-core CPU (1 thread, CPU
# time, `python -m engine.bench prefill_chunks`): chunks of 256 cost ~6% more than one forward
# (matmuls over 256 rows are ~5% less efficient per token), 128 cost ~18%, and 512 no less than
# 256 (attention with a chunk's mask costs more over 512 rows here). 256 moves a progress bar six
# times on such a prompt for about 6%. With 2 threads on the same machine while other jobs kept
# it oversubscribed, every forward paid for its threads' synchronization and 256 cost +187%:
# chunking is off by default, a toggle for where the threads are not fighting for cores.
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
    kv_cache_mb: float = 512  # prefix cache (KV reuse) budget in MiB; 0 keeps nothing
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
        if isinstance(self.kv_cache_mb, bool) or not isinstance(self.kv_cache_mb, (int, float)) \
                or not 0 <= self.kv_cache_mb < 2**40:
            raise InvalidRequest(f"--kv-cache-mb must be a number of MiB >= 0, not {self.kv_cache_mb!r}", "kv_cache_mb")
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

    max_new_tokens: int = 256
    temperature: float = 0.2  # SmolLM2's model card suggests 0.2 / top_p 0.9; 0 means greedy
    top_p: float = 0.9
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None  # same seed, same output
    stop: tuple[str, ...] = ()
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
        "quantization); none: the variant the engine loaded", glossary="weight_mb")
    chunked_prefill: bool = toggle(
        False, "bool", "Chunked prefill", "prefill long prompts in chunks: a progress bar and Stop between "
        "chunks, for some extra prefill time", glossary="prefill_ms")
    prefill_chunk_tokens: int = toggle(
        PREFILL_CHUNK_TOKENS, "int", "Chunk tokens", "prompt tokens per prefill chunk (with chunked prefill)",
        lo=16, hi=65536, glossary="prefill_ms", only_with="chunked_prefill", short="chunk")
    compiled_decode: bool = toggle(
        False, "bool", "Compiled step", "decode each token through one torch.compile graph of the whole step "
        "(norms, rotary positions and adds fused; one call instead of ~900): it pays where the matmuls are "
        "cheap (weight-only int4/int8), and the first request per weights variant compiles it (tens of "
        "seconds of setup)", glossary="tpot_ms")
    extra: dict = field(default_factory=dict, compare=False)  # room for features still to come

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

    def validate(self) -> GenerationConfig:
        """Raise InvalidRequest for any value the engine cannot honour; return self otherwise."""
        _check_int("max_new_tokens", self.max_new_tokens, lo=1)
        _check_number("temperature", self.temperature, lo=0.0, hi=100.0)
        _check_number("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True)
        _check_int("top_k", self.top_k, lo=0)
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, hi=2**63 - 1)
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidRequest("stop must be a list of strings", "stop")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed", "stop")
        for s in self.stop:
            if not s or len(s) > MAX_STOP_CHARS:
                raise InvalidRequest(f"each stop string must have 1 to {MAX_STOP_CHARS} characters", "stop")
        for t in TOGGLES:
            t.check(getattr(self, t.name))
        if self.compiled_decode and self.speculative != "off":
            raise InvalidRequest("compiled_decode compiles the plain one-token step; speculation verifies several "
                                 "tokens per forward, which it does not cover: turn one of them off", "compiled_decode")
        return self


TOGGLES = declared(GenerationConfig)  # the page, API, CLI and remote engine derive from these
TOGGLE = {t.name: t for t in TOGGLES}


def _check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, not {value!r}", name)
    if lo is not None and value < lo:
        raise InvalidRequest(f"{name} must be at least {lo}, not {value}", name)
    if hi is not None and value > hi:
        raise InvalidRequest(f"{name} must be at most {hi}, not {value}", name)


def _check_number(name: str, value, lo: float, hi: float, lo_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number, not {value!r}", name)
    if value < lo or (lo_open and value == lo) or value > hi:
        lo_text = f"> {lo}" if lo_open else f">= {lo}"
        raise InvalidRequest(f"{name} must be {lo_text} and <= {hi}, not {value}", name)
