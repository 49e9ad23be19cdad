"""Shared fixtures. The bundled model is loaded once per test session (fp32, so exactness
tests compare like with like); unit tests use a tiny random Llama built from a config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2-135M-Instruct, fp32, fast path."""
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    return load(LoadConfig(dtype="fp32", progress=False))


@pytest.fixture(scope="session")
def bundled_engine(bundled):
    from engine.serving.service import Engine

    engine = Engine(bundled)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tokenizer(bundled):
    return bundled.tokenizer


def build_tiny_model_dir(path: Path, tokenizer, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    """A small random model (real tokenizer, 2 layers) saved as a transformers folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **{**sizes, **overrides},  # overrides win
    )
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    from engine.core.config import LoadConfig
    from engine.model.loader import load

    return load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
