"""The roofline of a reply, checked by hand on the tiny model (2 layers, hidden 64, 4 heads of 16,
2 KV heads, MLP 128, vocabulary 49,152, tied embeddings, fp32), and the machine limits' cache."""

import json

import pytest
import torch

from engine.core.config import GenerationConfig
from engine.core.timeline import Timeline
from engine.lab import attach
from engine.measure import machine_limits, roofline
from engine.measure.machine_limits import MachineLimits
from engine.serving import work
from engine.serving.service import Engine

# Per layer: q 64×64, k and v 64×32 each, o 64×64 = 12,288; MLP 3 × 64×128 = 24,576 → 36,864; ×2 layers.
LAYER_PARAMS = 73_728
LM_HEAD = 49_152 * 64  # 3,145,728 (logits of the last position only)
# weights: embedding (tied lm_head) 3,145,728 + layers 73,728 + norms 2×2×64 + 64 = 3,219,776 params × 4 bytes
WEIGHT_BYTES = 12_879_104
KV_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V × layers × KV heads × head_dim × 4 bytes = 512
LIMITS = MachineLimits(key={"test": True}, measured_at="2026-12-01T09:00:00Z", copy_gbps=7.0,
                       matmul_tflops={"fp32": 0.1}, read_gbps=10.0)


def test_shape_and_hand_counted_flops(tiny):
    shape = work.ModelShape.of(tiny.model)
    assert shape.layer_matmul_params == LAYER_PARAMS and shape.lm_head_params == LM_HEAD
    assert shape.kv_bytes_per_token(torch.float32) == KV_PER_TOKEN
    # the KV cache's own precision: 2-byte elements; int8 1 byte + a 4-byte scale per head per position
    assert shape.kv_bytes_per_token(torch.float32, "fp16") == shape.kv_bytes_per_token(torch.float32, "bf16") == 256
    assert shape.kv_bytes_per_token(torch.float32, "int8") == 2 * 2 * 2 * (16 + 4) == 160
    # 10 new tokens after 0 cached attend to 1+…+10 = 55 keys; attention 4 × 2 layers × 4 heads × 16 × 55
    assert work.prefill_flops(shape, 10) == 2 * LAYER_PARAMS * 10 + 2 * LM_HEAD + 28_160 == 7_794_176
    # 3 new tokens after 5 cached attend to 6 + 7 + 8 = 21 keys
    assert work.prefill_flops(shape, 3, 5) == 2 * LAYER_PARAMS * 3 + 2 * LM_HEAD + 4 * 2 * 4 * 16 * 21
    # 4 steps after a 10-token prompt, 5 output tokens: contexts 11, 12, 13, 14 = 4 × (10 + 5/2)
    assert work.decode_bytes(WEIGHT_BYTES, KV_PER_TOKEN, 4, 10, 5) == 4 * WEIGHT_BYTES + KV_PER_TOKEN * 50


@pytest.mark.parametrize("max_batch", [1, 4])  # the batching worker (the app's default) once left them all null
def test_a_reply_carries_its_fractions(tiny, max_batch):
    engine = attach(Engine(tiny, max_batch=max_batch), LIMITS)  # the limits, as the entry point attaches them
    try:
        done = engine.complete(None, GenerationConfig(temperature=0.0, max_new_tokens=6),
                               prompt_ids=list(range(100, 110)))
    finally:
        engine.close()
    tl = done.timeline
    assert tl.weight_bytes == WEIGHT_BYTES and tl.compute_dtype == "fp32" and tl.context_max == 512
    assert tl.prefill_flops == 7_794_176
    tflops = 7_794_176 / (tl.prefill_ms / 1e3) / 1e12
    assert tl.prefill_tflops == pytest.approx(tflops)
    assert tl.prefill_compute_fraction == pytest.approx(tflops / 0.1)
    assert tl.prefill_tps == pytest.approx(10 / (tl.prefill_ms / 1e3))
    n = tl.output_tokens
    assert n >= 2 and tl.decode_steps == n - 1
    moved = (n - 1) * WEIGHT_BYTES + KV_PER_TOKEN * (n - 1) * (10 + n / 2)
    assert tl.decode_gbps == pytest.approx(moved / (tl.decode_ms / 1e3) / 1e9)
    assert tl.decode_bandwidth_fraction == pytest.approx(tl.decode_gbps / 10.0)
    assert tl.context_tokens == 10 + n
    d = tl.to_dict()  # what the API's `timings` and the exports carry
    for name in ("prefill_tflops", "prefill_compute_fraction", "decode_gbps", "decode_bandwidth_fraction",
                 "prefill_tps", "context_tokens", "context_max"):
        assert d[name] == pytest.approx(getattr(tl, name))
    assert d["roofline"]["peak_tflops"] == 0.1 and d["roofline"]["read_gbps"] == 10.0
    assert d["roofline"]["peak_unit"] == "TFLOP/s"  # the page shows the engine's unit, not its own guess
    assert d["roofline"]["copy_gbps"] == 7.0  # for reference: no fraction divides by it


def test_unknowns_stay_none_never_zero():
    tl = Timeline(prompt_tokens=None)
    m = tl.metrics()
    for name in ("prompt_tokens", "context_tokens", "context_max", "prefill_tps", "prefill_tflops",
                 "prefill_compute_fraction", "decode_gbps", "decode_bandwidth_fraction"):
        assert m[name] is None, name
    assert "n/a" in tl.summary()


def test_limits_are_cached_per_machine_with_their_date(tmp_path, monkeypatch):
    calls = []
    real = machine_limits.measure

    def counted(*a, **kw):
        calls.append(a)
        return real(a[0], a[1], 0.2, 2)

    monkeypatch.setattr(machine_limits, "measure", counted)
    first = machine_limits.load_or_measure(tmp_path, "cpu", ("fp32",))
    again = machine_limits.load_or_measure(tmp_path, "cpu", ("fp32",))
    assert len(calls) == 1 and again.to_dict() == first.to_dict()
    assert first.copy_gbps > 0 and first.read_gbps > 0 and first.matmul_tflops["fp32"] > 0
    assert first.date == first.measured_at[:10]
    assert first.details["read"]["rounds_n"] == 2 and first.details["read"]["spread"] is not None
    path = machine_limits.cache_file(tmp_path, machine_limits.machine_key("cpu"))
    assert json.loads(path.read_text())["limits"]["key"]["threads"] >= 1
    machine_limits.load_or_measure(tmp_path, "cpu", ("fp32",), force=True)
    assert len(calls) == 2


def test_stats_line_dashes_unknowns_and_flags_fractions_above_the_roof():
    from ui.chat import record_view
    from ui.compare import delta as compare

    remote = {"ttft_ms": 80.0, "e2e_ms": 200.0, "decode_tps": 30.0, "prompt_tokens": None, "output_tokens": 5,
              "context_tokens": None, "context_max": None, "prefill_tps": None, "measured_at": "client"}
    line = record_view.stats_line_html(remote)
    assert "prefill rate —" in line and "— → 5 tok" in line and "context — / — tok" in line
    assert "prefill % of matmul peak —" in line and "decode % of read bandwidth —" in line
    assert "the remote server sent no usage" in line and " 0 tok" not in line
    local = {**remote, "prompt_tokens": 30, "context_tokens": 35, "context_max": 512, "prefill_tps": 1500.0,
             "measured_at": None, "prefill_tflops": 0.05, "prefill_compute_fraction": 1.6,
             "decode_gbps": 5.0, "decode_bandwidth_fraction": 0.25}
    line = record_view.stats_line_html(local)
    assert "prefill 1,500.0 tok/s" in line and "context 35 / 512 tok" in line and "decode 25% of bandwidth" in line
    assert 'class="lab-over"' in line and "above the measured limit" in line  # 160% of the peak: flagged
    # int8 weights against fp32 in the A/B delta: bytes per token and the fraction side by side
    fp32 = {"decode_mb_per_token": 541.0, "decode_bandwidth_fraction": 0.30}
    int8 = {"decode_mb_per_token": 223.0, "decode_bandwidth_fraction": 0.12}
    deltas = {d["metric"]: d for d in compare.delta_rows(fp32, int8)}
    assert deltas["decode_mb_per_token"]["ratio"] == pytest.approx(223 / 541)
    assert deltas["decode_mb_per_token"]["winner"] == "B" and "decode_bandwidth_fraction" in deltas


def test_a_head_variant_reads_the_untied_embedding_one_row_a_step(tiny):
    """`+head` gives lm_head its own quantized copy: a step then reads one row of the embedding,
    not all of it (the page once showed 201 MB a token for a 96 MB step)."""
    engine = attach(Engine(tiny), LIMITS)
    try:
        done = engine.complete(None, GenerationConfig(temperature=0.0, max_new_tokens=6, quantization="int8wo+head"),
                               prompt_ids=list(range(100, 110)))
    finally:
        engine.close()
    tl = done.timeline
    step = tl.weight_bytes - 49_152 * 64 * 4 + 64 * 4  # all weights less the embedding but one row
    n = tl.output_tokens
    assert n >= 2 and tl.decode_bytes == pytest.approx((n - 1) * step + KV_PER_TOKEN * (n - 1) * (10 + n / 2))
    assert step < tl.weight_bytes / 2  # the embedding is most of the tiny model's bytes


def _cuda_limits(**kw):
    return MachineLimits(key={"device": "cuda", "cuda_device": "fake GPU"}, measured_at="2026-12-03T09:00:00Z",
                         copy_gbps=3000.0, read_gbps=4000.0, matmul_tflops={"fp32": 50.0, "bf16": 700.0}, **kw)


def _done_timeline(tiny):
    engine = Engine(tiny)  # no limits attached: the worker counts the work, the roofs stay unknown
    try:
        return engine.complete(None, GenerationConfig(temperature=0.0, max_new_tokens=6),
                               prompt_ids=list(range(100, 110))).timeline
    finally:
        engine.close()


def test_on_cuda_the_roofline_divides_by_the_gpus_limits_never_the_hosts(tiny):
    """A CUDA model's fractions divide by the CUDA probe (HBM read GB/s, the model dtype's tensor-core
    peak); the host's limits are not used for it (the fractions stay unknown). The device is an input
    of `annotate`, so a CPU run checks the CUDA branch with fake limits."""
    tl = _done_timeline(tiny)
    assert tl.read_gbps is None and tl.decode_bandwidth_fraction is None
    host = MachineLimits(key={"device": "cpu"}, measured_at="2026-12-03T09:00:00Z", copy_gbps=7.0,
                         matmul_tflops={"fp32": 0.1, "bf16": 0.2}, read_gbps=10.0)
    roofline.annotate(tl, tiny.model, tiny.weight_bytes(), host, "bf16", device="cuda")
    assert tl.read_gbps is None and tl.peak_tflops is None  # the host's roofs: not a GPU's
    assert tl.decode_bandwidth_fraction is None and tl.prefill_compute_fraction is None
    assert tl.decode_gbps is not None  # the work done is still counted
    roofline.annotate(tl, tiny.model, tiny.weight_bytes(), _cuda_limits(), "bf16", device="cuda")
    assert tl.read_gbps == 4000.0 and tl.peak_tflops == 700.0  # bf16's tensor-core peak, not fp32's
    assert tl.decode_bandwidth_fraction == pytest.approx(tl.decode_gbps / 4000.0)
    assert tl.prefill_compute_fraction == pytest.approx(tl.prefill_tflops / 700.0)
    roofline.annotate(tl, tiny.model, tiny.weight_bytes(), _cuda_limits(), "fp32", device="cuda")
    assert tl.peak_tflops == 50.0
    # on its own device (the tiny model is on the CPU), limits of another device are refused too
    roofline.annotate(tl, tiny.model, tiny.weight_bytes(), _cuda_limits(), "fp32")
    assert roofline.model_device(tiny.model) == "cpu" and tl.read_gbps is None
    assert roofline.limits_for(LIMITS, "cuda") is LIMITS  # limits made by hand (no device in the key) are taken


def test_a_variants_memory_on_cuda_is_gpu_memory(monkeypatch):
    """device_memory: torch's CUDA allocations and the driver's free/total (fed in here); none on a CPU."""
    import torch

    from engine.bench import gpu_models
    from engine.platform.device_memory import device_memory

    assert device_memory("cpu") is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 16 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 30 * 2**30)
    mem = device_memory("cuda")
    assert mem == {"allocated_bytes": 16 * 2**30, "peak_allocated_bytes": 30 * 2**30, "free_bytes": 100 * 2**30,
                   "total_bytes": 141 * 2**30}
    assert gpu_models.device_bytes("cuda")["allocated"] == 16 * 2**30
    assert gpu_models.device_bytes("cpu") == {"allocated": None, "free": None, "total": None}


def test_a_w8a_variants_prefill_is_held_to_the_int8_peak(tiny):
    """A variant whose projections run integer dot products (Kernel.WO_INT8ACT) is measured against the
    machine's int8 peak, not the fp32 one (against which it once read 113%): the plan says which, per
    prefill length; where its rows take another kernel, the model's dtype stays the roof."""
    from engine.kernels.catalogue import Kernel

    limits = MachineLimits(key={"test": True}, measured_at="2026-12-05T09:00:00Z", copy_gbps=7.0,
                           matmul_tflops={"fp32": 0.1, "int8": 0.4}, read_gbps=10.0)
    engine = attach(Engine(tiny, max_batch=1), limits)
    try:
        done = engine.complete(None, GenerationConfig(temperature=0.0, max_new_tokens=4, quantization="int8w8a"),
                               prompt_ids=list(range(100, 110)))
        plan = engine.worker.variants.get("int8w8a").runner.plan
    finally:
        engine.close()
    tl = done.timeline
    integer = plan.linears["qkv"].kernel(10) is Kernel.WO_INT8ACT
    assert plan.roof(10) == ("int8" if integer else None) and plan.roof(10) == plan.linears["qkv"].kernel(10).roof
    want = 0.4 if integer else 0.1
    assert tl.compute_dtype == ("int8" if integer else "fp32") and tl.peak_tflops == want
    assert tl.to_dict()["roofline"]["peak_unit"] == ("TOP/s" if integer else "TFLOP/s")  # one declaration
    assert tl.prefill_compute_fraction == pytest.approx(tl.prefill_tflops / want)


def test_a_re_probe_after_an_int8_reply_keeps_every_peak_it_held(monkeypatch):
    """The idle re-probe a w8a reply asks for names int8; the peaks held for the loaded dtype stay probed."""
    held = MachineLimits(key={"test": True}, measured_at="2026-12-05T09:00:00Z", copy_gbps=7.0,
                         matmul_tflops={"fp32": 0.1, "fp16": 0.3, "int8": 0.4}, read_gbps=10.0)
    asked = []
    monkeypatch.setattr(machine_limits, "load_or_measure",
                        lambda cache_dir, device, dtypes, **kw: asked.append(dtypes) or held)
    roofline.Roofline(held).remeasure("cpu", "int8")
    assert set(asked[0]) >= {"fp32", "fp16", "int8"}
