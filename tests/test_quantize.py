"""Quantization variants: each builds and generates on CPU, its bytes are counted for real, its
quality is measured, requests switch variants one by one, and what cannot run fails alone."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_model_dir
from support import ask

from engine.bench import run_request
from engine.core.config import GenerationConfig, LoadConfig
from engine.core.errors import InvalidRequest, LoadError
from engine.core.request import Request
from engine.platform import capabilities
from engine.model.loaded import weight_bytes
from engine.model.loader import load
from engine.quant.quantize import (
    FP32_ACTIVATIONS,
    QUANTIZED,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    quantizable_linears,
    split_name,
)
from engine.quant.weight_only import INT4_GROUP_SIZE
from engine.serving.variants import VariantSet, build
from engine.serving.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
BNB = ("int8", "nf4", "fp4")  # the bitsandbytes variants
# Where bitsandbytes cannot load (an x86 CPU without AVX2: importing it dies with SIGILL), its
# tests skip with the reason; test_capabilities.py checks that its variants are refused up front.
needs_bnb = pytest.mark.skipif(capabilities.detect().bnb_unusable is not None,
                               reason=f"{capabilities.detect().bnb_unusable} "
                               "(test_bitsandbytes_is_refused_up_front_where_importing_it_would_crash covers it)")
GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=12)
PROMPTS = ["What is the capital of France?", "Name three colors."]


@pytest.fixture(scope="module")
def bf16(bundled):
    """The bundled model in bf16 (the default on this CPU), as the unquantized reference."""
    return build(bundled, "bf16")[0]


@pytest.fixture(scope="module")
def variants(bf16):
    # quality on 2 of the fixed exchanges (128 positions) keeps CI quick
    return VariantSet(bf16, budget_bytes=10**10, quality_texts=2)


@pytest.fixture(scope="module")
def worker(bf16, variants):
    w = Worker(bf16, variants=variants)
    yield w
    w.close()


# over this bf16 base all but bf16wo, which it refuses (tests/test_bf16_weights.py builds it over fp32)
@pytest.mark.parametrize("name", [pytest.param(n, marks=needs_bnb) if n in BNB else n for n in QUANTIZED
                                  if split_name(n)[0] not in FP32_ACTIVATIONS])
def test_each_variant_builds_and_generates_on_cpu(variants, bf16, name):
    v = variants.get(name)
    assert v.loaded.model is not bf16.model and v.loaded.device.type == "cpu"
    assert not quantizable_linears(v.loaded.model), "every block linear was replaced"
    done = run_request(v.loaded, ask(PROMPTS[0]), GREEDY, runner=v.runner)
    assert done.output_tokens >= 1 and done.text.strip()
    assert v.build_s > 0 and v.weight_bytes > 0


@needs_bnb
def test_variants_share_what_they_do_not_quantize(variants, bf16):
    v = variants.get("int8")
    assert v.loaded.model.embed.weight is bf16.model.embed.weight  # the tied embedding / lm_head
    assert v.loaded.model.lm_head.weight is bf16.model.lm_head.weight
    assert v.loaded.model.blocks[0].qkv is not bf16.model.blocks[0].qkv


def _bytes_apart(bf16):
    """The bytes of the model outside its quantizable linears (shared, unquantized), and of those linears."""
    base = weight_bytes(bf16.model)
    linears = quantizable_linears(bf16.model)
    linear_bytes = sum(lin.weight.numel() * 2 for _, _, lin in linears)
    return base, base - linear_bytes, linear_bytes, linears  # rest: embedding (tied lm_head), norms


def test_weight_bytes_count_the_quantized_storage(variants, bf16):
    base, rest, linear_bytes, linears = _bytes_apart(bf16)
    # int8wo: int8 weights plus one bf16 scale per output channel
    expected_wo = rest + sum(lin.weight.numel() + 2 * lin.out_features for _, _, lin in linears)
    assert variants.get("int8wo").weight_bytes == expected_wo
    # int4wo: half a byte per weight plus a bf16 scale and zero per group
    expected_4 = rest + sum(lin.weight.numel() // 2 + 4 * lin.weight.numel() // INT4_GROUP_SIZE
                            for _, _, lin in linears)
    assert variants.get("int4wo").weight_bytes == expected_4
    # +head: lm_head's own int8 copy beside the embedding, which stays
    head = bf16.model.lm_head
    assert variants.get("int8wo+head").weight_bytes == expected_wo + head.weight.numel() + 2 * head.out_features
    # +head8: 4-bit blocks, lm_head's own int8 copy
    assert variants.get("int4wo+head8").weight_bytes == expected_4 + head.weight.numel() + 2 * head.out_features
    assert expected_wo <= 0.65 * base


@needs_bnb
def test_weight_bytes_count_bitsandbytes_storage(variants, bf16):
    base, rest, linear_bytes, linears = _bytes_apart(bf16)
    # int8 (bitsandbytes): one int8 per weight plus one fp32 scale per output row, kept outside
    # the module's parameters (state.SCB) and still counted.
    expected_int8 = rest + sum(lin.weight.numel() + 4 * lin.out_features for _, _, lin in linears)
    assert variants.get("int8").weight_bytes == expected_int8
    # nf4: half a byte per weight plus block absmax, and no more than the targets allow
    nf4 = variants.get("nf4").weight_bytes
    assert rest + linear_bytes // 4 < nf4
    assert nf4 <= 0.45 * base
    assert expected_int8 <= 0.65 * base


def test_quality_is_measured_and_int8_keeps_above_its_floor(variants):
    default = variants.default.report()
    assert default["top1_agreement"] == 1.0 and default["mean_kl"] == 0.0
    reports = {n: variants.get(n).report() for n in ("int8wo", "int4wo")}
    for r in reports.values():
        assert r["quality_positions"] == 128
        assert 0.0 <= r["top1_agreement"] <= 1.0 and r["mean_kl"] >= 0.0
    assert reports["int8wo"]["top1_agreement"] >= 0.90
    assert reports["int4wo"]["top1_agreement"] >= 0.80
    # Not "4 bits lose more than 8" here: the bundled blocks are Q4_1 (4-bit groups of 32), which
    # int4wo's groups of 32 reproduce almost exactly, while int8wo re-rounds them per output channel
    # (docs/quantization.md). Groups of 64 would re-round them too, and this would fail.
    assert reports["int4wo"]["mean_kl"] < reports["int8wo"]["mean_kl"]


@needs_bnb
def test_bitsandbytes_quality_is_measured_and_int8_keeps_above_its_floor(variants):
    reports = {n: variants.get(n).report() for n in ("int8", "nf4")}
    for r in reports.values():
        assert r["quality_positions"] == 128
        assert 0.0 <= r["top1_agreement"] <= 1.0 and r["mean_kl"] >= 0.0
    assert reports["int8"]["top1_agreement"] >= 0.90
    assert reports["int8"]["mean_kl"] < reports["nf4"]["mean_kl"]  # 4 bits lose more than 8


def test_each_request_is_served_by_the_variant_it_names(worker, variants):
    # bitsandbytes' pair where it loads, else torch's own 8- and 4-bit kernels (same switching)
    eight, four = ("int8", "nf4") if capabilities.detect().bnb_unusable is None else ("int8wo", "int4wo")
    order = [None, eight, four, None, four, "int8wo", eight, None]
    handles = [(q, p, worker.submit(Request(messages=ask(p), config=GREEDY.replace(quantization=q))))
               for p in PROMPTS for q in order]
    served = {}
    for q, p, h in handles:
        done = h.result(timeout=300)
        name = q or variants.default_name
        assert done.timeline.counters.quantization == name
        served.setdefault((name, p), set()).add(tuple(done.token_ids))
    for (name, prompt), outputs in served.items():
        # alone, and through the worker: on this thread it would race the worker's idle forwards on the
        # same model (speculation's cost table), and bitsandbytes' int8 layers keep per-call state
        solo = worker.submit(Request(messages=ask(prompt), config=GREEDY.replace(
            quantization=None if name == variants.default_name else name))).result(timeout=300)
        assert outputs == {tuple(solo.token_ids)}, f"{name} on {prompt!r}"
    default = variants.default_name
    assert any(served[(four, p)] != served[(default, p)] for p in PROMPTS), "switching had no effect"
    report = variants.report()["variants"]
    assert all(r["decode_tps"] for r in report if r["name"] in (eight, four, default))


def test_unknown_variant_is_refused_with_the_available_ones(worker):
    with pytest.raises(InvalidRequest) as err:
        worker.submit(Request(messages=ask("hi"), config=GREEDY.replace(quantization="int3")))
    assert err.value.param == "quantization"
    assert "int3" in str(err.value) and "nf4" in str(err.value) and "int8" in str(err.value)


def test_a_retired_variant_is_refused_with_its_replacement_everywhere_a_name_arrives(worker, variants, bf16):
    """int4w8a+head is no longer offered (not in METHODS, so not on the page, in the bench's defaults or
    the report); a request, a saved config or a --variants flag that still names it gets one clear
    InvalidRequest naming int4w8a+head8."""
    from engine.quant.quantize import METHODS, RETIRED

    assert "int4w8a+head" in RETIRED and "int4w8a+head" not in METHODS and RETIRED["int4w8a+head"][0] in METHODS
    with pytest.raises(InvalidRequest) as err:
        worker.submit(Request(messages=ask("hi"), config=GREEDY.replace(quantization="int4w8a+head")))
    assert err.value.param == "quantization" and "retired" in str(err.value) and "'int4w8a+head8'" in str(err.value)
    for make in (lambda: build(bf16, "int4w8a+head"), lambda: variants.preload(["int4w8a+head"])):
        with pytest.raises(InvalidRequest, match=r"use 'int4w8a\+head8' instead"):
            make()
    assert worker.submit(Request(messages=ask("hi"), config=GREEDY)).result(timeout=60).output_tokens > 0


def test_upcasting_is_refused_with_advice(worker):
    h = worker.submit(Request(messages=ask("hi"), config=GREEDY.replace(quantization="fp32")))
    with pytest.raises(LoadError, match="--dtype fp32"):
        h.result(timeout=60)
    assert worker.submit(Request(messages=ask("hi"), config=GREEDY)).result(timeout=60).output_tokens > 0


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory, tokenizer):
    """A tiny Llama with 48-wide layers: bitsandbytes' 4-bit CPU kernel needs multiples of 32 and 64."""
    path = build_tiny_model_dir(tmp_path_factory.mktemp("odd-llama"), tokenizer, hidden_size=48)
    return load(LoadConfig(model=str(path), dtype="fp32", progress=False))


@needs_bnb
def test_a_4bit_shape_the_cpu_kernel_rejects_fails_alone(odd_model):
    from bitsandbytes.functional import has_avx512bf16

    w = Worker(odd_model)
    try:
        h = w.submit(Request(messages=ask("hi"), config=GREEDY.replace(quantization="nf4")))
        if has_avx512bf16():  # the kernel that has the rule
            with pytest.raises(LoadError, match="divisible by 32"):
                h.result(timeout=120)
            assert h.final.detail["user_error"] and "Try int8" in h.final.detail["message"]
            again = w.submit(Request(messages=ask("hi"), config=GREEDY.replace(quantization="nf4")))
            with pytest.raises(LoadError, match="divisible by 32"):  # remembered: no second build
                again.result(timeout=120)
            assert "nf4" in w.variants.report()["failed"]
        else:  # other CPUs take the generic kernel, which has no such rule
            assert h.result(timeout=120).output_tokens > 0
        for q in (None, "int8", "int8wo"):  # the others keep working
            assert w.submit(Request(messages=ask("hi"), config=GREEDY.replace(quantization=q))).result(
                timeout=120).output_tokens > 0
    finally:
        w.close()


def test_the_memory_budget_drops_the_least_recently_used(tiny):
    base = weight_bytes(tiny.model)
    vs = VariantSet(tiny, quality_texts=0, budget_bytes=1)
    with pytest.raises(LoadError, match="does not fit"):
        vs.get("int8wo")
    assert vs.report()["resident"] == [vs.default_name]  # the default stays and serves
    assert run_request(vs.get(None).loaded, ask("hi"), GREEDY).output_tokens > 0

    # what each variant adds beside the default (they share its embedding, counted once)
    roomy = VariantSet(tiny, quality_texts=0, budget_bytes=10**10)
    extra = {}
    for name in ("int8wo", "int8"):
        before = roomy.resident_bytes()
        roomy.get(name)
        extra[name] = roomy.resident_bytes() - before
    assert 0 < extra["int8wo"] < base / 10

    vs = VariantSet(tiny, quality_texts=0, budget_bytes=base + int(1.5 * max(extra.values())))
    one = vs.get("int8wo")
    vs.get("int8")  # the two together exceed the budget: the least recently used goes
    report = vs.report()
    assert report["resident"] == [vs.default_name, "int8"] and report["evictions"] == 1
    assert report["resident_bytes"] <= report["budget_bytes"]
    again = vs.get("int8wo")  # dropped, so rebuilt on demand
    assert again is not one and vs.report()["resident"] == [vs.default_name, "int8wo"]


def test_int8_weight_only_linear_matches_its_dequantized_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=True)
    x = torch.randn(3, 5, 64)
    q = Int8WeightOnlyLinear.from_linear(lin, compute_dtype=torch.float32)  # fp32 in the kernel: exact to fp32
    dequantized = q.weight_int8.float() * q.scale[:, None]
    assert torch.allclose(q(x), x @ dequantized.T + q.bias, atol=1e-4)
    assert (dequantized - lin.weight).abs().max() <= q.scale.max() / 2 + 1e-6  # rounding, per channel


def test_int4_weight_only_linear_matches_its_dequantized_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 96, bias=True)
    x = torch.randn(3, 5, 128)
    q = Int4WeightOnlyLinear.from_linear(lin, compute_dtype=torch.float32, keep_unpacked=True,
                                         ours_layout=False)  # torch's kernel: fp32 in it
    w = q.dequantized()
    assert torch.allclose(q(x), x @ w.T + q.bias, atol=1e-4)  # ours (fp16 scales): tests/test_cpu_gemm.py
    step = (lin.weight.reshape(-1, q.group_size).amax(1) - lin.weight.reshape(-1, q.group_size).amin(1)) / 15
    assert ((w - lin.weight).abs().reshape(-1, q.group_size).amax(1) <= step / 2 + 1e-3 * step.max()).all()


def test_cli_quantization_flag(tiny_model_dir):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "engine", "hi", "--model", str(tiny_model_dir), "--dtype", "fp32",
                        "--quantization", "int8wo", "--max-new-tokens", "3", "--temperature", "0", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["timeline"]["quantization"] == "int8wo" and out["timeline"]["variant_build_ms"] > 0
    assert {v["name"] for v in out["model"]["variants"] if v["resident"]} == {"fp32", "int8wo"}


@pytest.mark.parametrize("max_batch", [1, 4])  # the batching worker's idle loop measured nothing once
def test_an_engine_measures_a_new_variants_quality_after_the_request_not_inside_it(tiny, max_batch):
    from engine.serving.service import Engine

    engine = Engine(tiny, max_batch=max_batch)
    try:
        done = engine.complete([{"role": "user", "content": "hi"}],
                               GenerationConfig(max_new_tokens=2, temperature=0.0, quantization="int8wo"))
        assert done.timeline.counters.quantization == "int8wo"
        deadline = time.time() + 120
        while engine.info().variant("int8wo").top1_agreement is None and time.time() < deadline:
            time.sleep(0.1)  # the idle worker measures it
        v = engine.info().variant("int8wo")
        assert v.resident and 0 <= v.top1_agreement <= 1 and v.mean_kl >= 0
    finally:
        engine.close()
