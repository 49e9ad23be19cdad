"""A variant whose build fails (bitsandbytes without its CUDA binary, out of memory) fails every later
request at once with the same clear error, without building it again."""

import types
from dataclasses import replace

import pytest
import torch
from support import ask

from engine.core.config import GenerationConfig
from engine.core.errors import LoadError
from engine.core.request import Request
from engine.quant import bnb, quantize
from engine.serving.variants import VariantSet
from engine.serving.worker import Worker


@pytest.fixture
def failing_nf4(monkeypatch):
    """nf4's per-Linear builder raising `error` (set on the returned object), counting its calls."""
    state = types.SimpleNamespace(calls=0, error=RuntimeError("No compatible CUDA binary found at "
                                                              "libbitsandbytes_cuda130.so"))

    def builder(linear, name, device, dtype):
        state.calls += 1
        raise state.error

    monkeypatch.setattr(bnb, "check", lambda *a: None)  # past the up-front checks: the build itself fails
    monkeypatch.setitem(quantize._BNB, "nf4", builder)
    return state


def test_a_failed_build_is_remembered_and_shown(tiny, failing_nf4):
    variants = VariantSet(tiny, quality_texts=0)
    with pytest.raises(LoadError, match="'nf4' could not be built on cpu: RuntimeError: No compatible CUDA binary") as first:
        variants.get("nf4")
    with pytest.raises(LoadError) as again:
        variants.get("nf4")
    assert str(again.value) == str(first.value) and failing_nf4.calls == 1
    info = {v.name: v for v in variants.infos()}["nf4"]
    assert not info.available and info.reason == str(first.value)
    assert variants.get("int8wo").loaded.model is not None  # the others keep building


def test_out_of_memory_says_so_with_advice(tiny, failing_nf4):
    failing_nf4.error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    variants = VariantSet(tiny, quality_texts=0)
    for _ in range(3):
        with pytest.raises(LoadError, match=r"could not be built on cpu \(out of memory\).*--variants-budget-mb"):
            variants.get("nf4")
    assert failing_nf4.calls == 1


def test_requests_for_it_fail_at_once_and_others_are_served(tiny, failing_nf4):
    worker = Worker(tiny)
    greedy = GenerationConfig(temperature=0, max_new_tokens=4)
    try:
        for _ in range(2):
            handle = worker.submit(Request(messages=ask("hi"), config=greedy.replace(quantization="nf4")))
            with pytest.raises(LoadError, match="No compatible CUDA binary"):
                handle.result(timeout=120)
        assert failing_nf4.calls == 1
        assert worker.submit(Request(messages=ask("hi"), config=greedy)).result(timeout=120).output_tokens > 0
    finally:
        worker.close()


def test_bitsandbytes_without_its_cuda_binary_is_refused_before_building(tiny, monkeypatch):
    class ErrorHandlerMockBNBNativeLibrary:  # the stand-in bitsandbytes puts in cextension.lib
        error_msg = "libcudart.so.13: cannot open shared object file"

    fake = types.SimpleNamespace(cextension=types.SimpleNamespace(lib=ErrorHandlerMockBNBNativeLibrary()))
    assert "libcudart.so.13" in bnb.native_library_missing(fake)
    assert bnb.native_library_missing(types.SimpleNamespace(cextension=types.SimpleNamespace(lib=object()))) is None
    monkeypatch.setattr(bnb.capabilities, "detect", lambda: types.SimpleNamespace(bnb_unusable=None))
    monkeypatch.setattr(bnb, "_import_bitsandbytes", lambda: fake)
    with pytest.raises(LoadError, match="no working native library for cuda here .*libcudart.so.13"):
        bnb.check("nf4", replace(tiny, device=torch.device("cuda")), [])
