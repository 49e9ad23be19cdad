"""The KV-reuse budget follows the device (engine/serving/kv_budget.py): sized from fake free-memory
figures, the user's MiB winning, and where it came from shown in engine info."""

import pytest
import torch

from engine.core.config import LoadConfig, parse_kv_cache_mb
from engine.core.errors import InvalidRequest
from engine.serving import kv_budget
from engine.serving.kv_budget import size

GIB = 2**30


def test_on_cuda_auto_takes_half_the_free_memory():
    b = size("auto", "cuda", free_bytes=120 * GIB)
    assert b.mb == 60 * 1024
    assert b.source == "auto: 50% of the 120.0 GiB free on cuda after the model loaded"
    assert size("auto", "cuda", free_bytes=2 * GIB).mb == 1024  # a full GPU: what is left, halved


def test_on_cuda_auto_reads_the_gpus_free_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: calls.append(d) or (10 * GIB, 80 * GIB))
    assert size("auto", torch.device("cuda", 0)).mb == 5 * 1024 and len(calls) == 1


def test_on_cpu_auto_keeps_512_mib_unless_memory_is_short():
    assert size("auto", "cpu", available_bytes=64 * GIB) == kv_budget.KVBudget(512.0, "auto: the CPU default of 512 MiB")
    small = size("auto", "cpu", available_bytes=1 * GIB)
    assert small.mb == 256 and "25% of the 1.0 GiB of memory available" in small.source


def test_the_users_figure_wins_on_every_device():
    for device in ("cpu", "cuda"):
        assert size(64.0, device, free_bytes=100 * GIB, available_bytes=100 * GIB) == kv_budget.KVBudget(64.0, "--kv-cache-mb 64")
    assert size(0, "cuda", free_bytes=GIB).mb == 0  # 0 keeps nothing


def test_the_flag_and_config_take_auto_or_mib():
    assert parse_kv_cache_mb("auto") == "auto" and parse_kv_cache_mb("12.5") == 12.5
    with pytest.raises(Exception, match="'auto' or a number of MiB"):
        parse_kv_cache_mb("-1")
    assert LoadConfig().kv_cache_mb == "auto"
    with pytest.raises(InvalidRequest, match="auto or a number"):
        LoadConfig(kv_cache_mb="lots")


def test_engine_info_shows_the_budget_and_where_it_came_from(tiny_model_dir):
    from engine.serving.service import Engine

    engine = Engine.load(LoadConfig(model=str(tiny_model_dir), dtype="fp32", progress=False))
    try:
        stats = engine.info().prefix_cache
        assert stats["budget_source"].startswith("auto: ")  # pinned to CPU by tests/conftest.py
        assert 0 < stats["budget_bytes"] <= 512 * 2**20
    finally:
        engine.close()
    given = kv_budget.prefix_cache(32.0, "cpu").stats()
    assert given["budget_bytes"] == 32 * 2**20 and given["budget_source"] == "--kv-cache-mb 32"
