"""Our own forward pass for Llama-family models (Llama, SmolLM, Mistral without sliding window, Qwen2).

Why not the transformers forward: at this model size a decode step is a few milliseconds of
matmuls, and the generic forward adds Python work around them (mask building, cache classes,
per-projection calls). This module keeps the weights transformers loaded, fuses the q/k/v and
gate/up projections into one matmul each, writes keys and values straight into a preallocated
`KVCache`, and returns logits only for the positions asked for. Measured against the same
model's `generate` by `python -m engine.bench baseline` (README).

Every projection is an `nn.Linear` module, so quantization (quantize.py) can swap it for a
quantized module and this forward keeps working unchanged.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from engine.kernels import cpu_attention, cpu_gemm, cpu_layers
from engine.kernels.cpu_gemm import ours, ours_serves, panels, plain_fp32_cpu  # noqa: F401 - our fp32 kernel's glue, used here and re-exported
from engine.measure import capabilities
from engine.model.kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def unsupported_reason(hf_model) -> str | None:
    """Why `hf_model` cannot use this fast path (None when it can)."""
    cfg = hf_model.config
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {cfg.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} is not silu"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention is not implemented in the fast path"
    if not hasattr(hf_model, "model") or not hasattr(hf_model.model, "rotary_emb"):
        return "the model has no rotary embedding module where a Llama-family model keeps it"
    return None


def _fuse(*linears: nn.Linear) -> nn.Linear:
    """One Linear whose output is the concatenation of the given Linears' outputs."""
    weight = torch.cat([lin.weight for lin in linears])
    has_bias = [lin.bias is not None for lin in linears]
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=any(has_bias), device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if any(has_bias):
        fused.bias = nn.Parameter(
            torch.cat([lin.bias if lin.bias is not None else weight.new_zeros(lin.out_features) for lin in linears]),
            requires_grad=False,
        )
    return fused


class RMSNorm(nn.Module):
    """The Llama RMSNorm, computed in float32 exactly as transformers does."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x):
        if x.dtype == torch.float32:  # one fused call, bit for bit the lines below in fp32 (tested)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Block(nn.Module):
    def __init__(self, hf_layer, eps: float):
        super().__init__()
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.attn_norm = RMSNorm(hf_layer.input_layernorm.weight, eps)
        self.qkv = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = attn.o_proj
        self.mlp_norm = RMSNorm(hf_layer.post_attention_layernorm.weight, eps)
        self.gate_up = _fuse(mlp.gate_proj, mlp.up_proj)
        self.down = mlp.down_proj
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.scaling = attn.scaling


class FastLlama(nn.Module):
    """A Llama-family causal LM with a preallocated KV cache. Batch size 1, one sequence."""

    def __init__(self, hf_model):
        super().__init__()
        reason = unsupported_reason(hf_model)
        if reason:
            raise ValueError(reason)
        cfg = hf_model.config
        base = hf_model.model
        self.config = cfg
        self.embed = base.embed_tokens
        self.blocks = nn.ModuleList(Block(layer, cfg.rms_norm_eps) for layer in base.layers)
        self.norm = RMSNorm(base.norm.weight, cfg.rms_norm_eps)
        self.lm_head = hf_model.lm_head
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = self.blocks[0].q_size // self.n_heads
        self.max_context = int(getattr(cfg, "max_position_embeddings", 2048))
        self.vocab_size = self.lm_head.out_features
        rotary = base.rotary_emb
        # cos/sin for every position, float32 like transformers' rotary module, cast once.
        positions = torch.arange(self.max_context, dtype=torch.float32, device=rotary.inv_freq.device)
        freqs = torch.outer(positions, rotary.inv_freq.float())
        emb = torch.cat([freqs, freqs], dim=-1)
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        dtype = self.embed.weight.dtype
        self.register_buffer("cos", (emb.cos() * scale).to(dtype), persistent=False)
        self.register_buffer("sin", (emb.sin() * scale).to(dtype), persistent=False)
        for module in self.modules():  # pack now, not inside the first request's prefill
            if isinstance(module, nn.Linear):
                packed_weight(module)
        self.packed_rows = dict(PACKED_ROWS)  # dtype -> (lo, hi): which projections take the packed copy
        self.ours_rows = 0  # fp32 products of up to this many rows through our kernel (choose_one_row_path)
        self.one_row_path: dict | None = None  # what `choose_one_row_path` measured (None: not measured)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(len(self.blocks), self.n_kv_heads, self.head_dim, capacity, self.dtype, self.device)

    @torch.inference_mode()
    def choose_one_row_path(self, rounds: int = 5, steps: int = 2) -> dict | None:
        """Measure a one-token decode step through each fp32 one-row kernel here — MKL's GEMV, the
        packed oneDNN weights, our panel kernel (engine/kernels/cpu_gemm.py, AVX2 or AVX-512) where it builds — alternating
        (paired per round: a neighbour's load slows all), and keep the fastest. Why measured: the
        order depends on the CPU and the thread count (Zen 3, AVX2, 2 threads, 300 tokens of context:
        packed 84 ms a step vs GEMV 104 ms; at 1 thread 119 vs 100 ms; our kernel streams the weights at
        ~88% of copy bandwidth there). The packed copy must win by 5% over GEMV to be taken (it costs
        memory); ours serves up to OURS_ROWS rows (a verify, a warm turn's few tokens) when it wins.
        fp32 CPU models only; None where there is no choice."""
        lo, hi = PACKED_ROWS[torch.float32]
        if self.dtype != torch.float32 or self.device.type != "cpu" or packed_weight(self.lm_head) is None:
            return None
        paths = {"gemv": (lo, 0), "packed": (1, 0)}  # path -> (packed rows from, ours up to)
        if cpu_gemm.available():
            paths["ours"] = (lo, OURS_ROWS)
        cache = self.new_cache(32 + rounds * steps * len(paths) + steps + 2)
        self.forward(torch.arange(32, device=self.device) % self.vocab_size, cache)
        times = {p: [] for p in paths}
        for r in range(rounds + 1):  # round 0 warms every path up and is dropped
            for path, (first, ours) in paths.items():
                self.packed_rows[torch.float32], self.ours_rows = (first, hi), ours
                cache.crop(32)
                t0 = time.perf_counter()
                for _ in range(steps):
                    self.forward(torch.tensor([7], device=self.device), cache)
                if r:
                    times[path].append((time.perf_counter() - t0) / steps)
        ratio = statistics.median(a / b for a, b in zip(times["packed"], times["gemv"]))
        best = "packed" if ratio <= ONE_ROW_PACKED_IF else "gemv"
        if "ours" in paths and statistics.median(a / b for a, b in zip(times["ours"], times[best])) < 1.0:
            best = "ours"
        self.packed_rows[torch.float32], self.ours_rows = (paths[best][0], hi), paths[best][1]
        if best == "ours":  # ours now takes every row count the packed fp32 copies served: free them
            for module in self.modules():
                if isinstance(module, nn.Linear) and module.weight.dtype == torch.float32:
                    _PACKED.pop(module.weight, None)
        ms = {f"{p}_ms": round(statistics.median(times[p]) * 1e3, 2) if p in times else None
              for p in ("packed", "gemv", "ours")}
        self.one_row_path = {"path": best, "threads": torch.get_num_threads(), **ms, "ratio": round(ratio, 3)}
        return self.one_row_path

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """Run `ids` (1-D) at positions [cache.length, cache.length + T); append their KV.

        Returns float32 logits: [T, vocab] when all_logits, else [1, vocab] for the last position.
        """
        T, start = ids.shape[0], cache.length
        end = start + T
        if end > self.max_context:
            raise ValueError(f"position {end} is beyond the context window ({self.max_context})")
        cache.ensure_capacity(end)
        with _gemm_backend(rows=T):
            x = self._blocks(ids, cache, start, end)
        cache.length = end
        if not all_logits:
            x = x[:, -1:]
        with _gemm_backend(rows=x.shape[1]):
            return project(self.lm_head, self.norm(x), self.packed_rows, self.ours_rows)[0].float()

    def _blocks(self, ids, cache: KVCache, start: int, end: int) -> torch.Tensor:
        T = end - start
        mask = None
        if T > 1 and start > 0:  # new tokens see the whole cached prefix, and causally each other
            mask = torch.ones(T, end, dtype=torch.bool, device=ids.device).tril(diagonal=start)
        rows = self.packed_rows
        decode_kernel = T == 1 and cpu_attention.serves(cache.k, self.n_heads)  # one decode row: it stores k, v too

        def attend(i: int, blk: Block, q, k, v):
            if decode_kernel:
                return cpu_attention.decode_attention_heads(q, k, v, [cache], [0], [start], i, blk.scaling).unsqueeze(2)
            cache.k[i, :, :, start:end] = k
            cache.v[i, :, :, start:end] = v
            return F.scaled_dot_product_attention(
                q, cache.k[i, :, :, :end], cache.v[i, :, :, :end], attn_mask=mask,
                is_causal=T > 1 and start == 0, scale=blk.scaling, enable_gqa=self.n_heads != self.n_kv_heads)

        x, cos, sin = self.embed(ids[None]), self.cos[start:end], self.sin[start:end]
        layers = cpu_layers.layer_weights(self) if T <= self.ours_rows else None
        if layers is not None:  # the same loop in one C++ call: the same bits
            return cpu_layers.run_layers(self, layers, x, cos, sin, [cache], [start], [T], [0],
                                         [0] if decode_kernel else [], [] if decode_kernel else [0], [mask])
        return self.run_blocks(x, cos, sin, lambda linear, x: project(linear, x, rows, self.ours_rows), attend)

    def run_blocks(self, x, cos, sin, linear, attend) -> torch.Tensor:
        """The decoder blocks over hidden states x ([1, T, hidden]): `linear(module, x)` runs a
        projection and `attend(layer, block, q, k, v)` stores k, v and returns attention. One loop for
        the eager forward and the compiled decode step (engine/model/compiled_step.py), so they cannot drift."""
        T = x.shape[1]
        H, KV, D = self.n_heads, self.n_kv_heads, self.head_dim
        for i, blk in enumerate(self.blocks):
            q, k, v = roped_heads(blk, linear(blk.qkv, blk.attn_norm(x)), H, KV, D, cos, sin)
            x = x + linear(blk.o, attend(i, blk, q, k, v).transpose(1, 2).reshape(1, T, H * D))
            gate, up = linear(blk.gate_up, blk.mlp_norm(x)).chunk(2, dim=-1)
            x = x + linear(blk.down, F.silu(gate) * up)
        return x


# oneDNN-packed copies of Linear weights, keyed by the weight tensor itself (so a module whose
# weight is replaced, cast or quantized never meets a stale copy; variants pack their own on first use).
_PACKED = WeakIdKeyDictionary()  # weight -> packed copy, or False: this weight cannot be packed
use_packed = True  # False: plain F.linear for every matmul (`python -m engine.bench verify` compares)
# dtype -> (lo, hi): from lo rows up to hi, `project` takes the packed copy. fp32 stops at 128: a
# long prefill is faster through MKL (1,390 rows, 2 threads, Zen 3: 3.18 s MKL, 3.65 s packed), a
# short one through the packed copy (20 rows after 1,370: 212 vs 154 ms). fp32's lo is 2 unless a
# model measured one row faster packed too (`FastLlama.choose_one_row_path`).
PACKED_ROWS = {torch.bfloat16: (3, 1 << 30), torch.float32: (2, 128)}
BATCH_ROWS = {**PACKED_ROWS, torch.float32: (1, 1 << 30)}  # batching: every fp32 row packed (batch_forward.py)
ONE_ROW_PACKED_IF = 0.95  # packed step / GEMV step at or below this: single rows go packed too
# Our fp32 kernel serves products of up to this many rows where it won the one-row measurement:
# decode steps, speculative verifies, a warm turn's new tokens, prompts and the batching scheduler's
# 256-token prompt chunks (Zen 4, 2 threads, the 120 projections: 1 row 15 ms against the packed
# copy's 26, 8 rows 19 vs 26, 64 rows 83 vs 83, 256 rows 291 vs 289; MKL 1.2-1.5x slower from 128
# rows up). Longer prefills keep the rules above (on the Zen 3 MKL led there). In a batch, per
# sequence (batch_forward.py).
OURS_ROWS = 256


ONE_ROW_KERNELS = {"packed": "packed oneDNN weights", "gemv": "MKL GEMV", "ours": "our panel kernel"}


def one_row_summary(one_row: dict) -> str:
    """What `choose_one_row_path` chose and measured, in one line (load notes, bench bandwidth)."""
    ours = f", {one_row['ours_ms']} ms ours" if one_row["ours_ms"] is not None else ""
    return (f"fp32 one-row matmuls: {ONE_ROW_KERNELS[one_row['path']]} (a step {one_row['packed_ms']} ms packed, "
            f"{one_row['gemv_ms']} ms GEMV{ours}, measured at load with {one_row['threads']} threads)")


def packed_weight(linear: nn.Module):
    """The oneDNN-packed copy of a plain bf16 or fp32 CPU Linear's weight (made once), else None.

    Why: `F.linear` hands oneDNN a plain bf16 weight, which it reorders into its blocked layout on
    every call; for a few rows that reordering is most of the cost. Measured over the 120
    projections of one SmolLM2 step (Zen 5): 3 rows 31.1 → 14.4 ms, 9 rows 34.6 → 18.9 ms, 256 rows
    271 → 212 ms, 1,500 rows 1,098 → 996 ms; results bitwise equal to `F.linear`'s oneDNN path.
    fp32 goes to MKL, whose few-row GEMM is slow here: on the Zen 3 (AVX2, 1 thread) a forward of
    3 / 5 / 9 tokens cost 1.99 / 1.68 / 2.18 one-token steps through MKL and 1.14 / 1.25 / 1.57
    through the packed copy, with 256 and 1,024 tokens on par (0.93x, 1.01x). So a speculative
    verify of k+1 tokens costs about one plain step, not two, and so do a warm turn's few new
    tokens. The packed fp32 kernel also gives each row the same bits whatever the row count, which
    batching needs (batch_forward.py). Price: a second copy of those weights in memory.
    """
    if type(linear) is not nn.Linear:  # quantized modules are subclasses or others
        return None
    w = linear.weight
    if w.device.type != "cpu" or w.dtype not in PACKED_ROWS:
        return None
    p = _PACKED.get(w)
    if p is None:
        caps = capabilities.detect()
        if not (caps.packed_bf16_weights if w.dtype == torch.bfloat16 else caps.packed_fp32_weights):
            return None  # e.g. AVX2-only CPUs for bf16: plain F.linear
        try:
            p = torch.ops.mkldnn._reorder_linear_weight(w.detach())
        except RuntimeError:  # a build or CPU whose oneDNN refuses it: the plain path, once decided
            p = False
        _PACKED[w] = p
    return p if p is not False else None


def packed_bytes() -> int:
    """Bytes held by packed weight copies, oneDNN's and our fp32 kernel's panels (all live models)."""
    copies = [p for p in _PACKED.values() if p is not False]
    return sum(p.numel() * p.element_size() for p in copies) + cpu_gemm.panels_bytes()


def project(linear: nn.Module, x: torch.Tensor, rows: dict | None = None, ours_rows: int = 0) -> torch.Tensor:
    """linear(x): through our fp32 kernel when x has at most `ours_rows` rows and it serves, else
    through the packed weight when x's row count is in its dtype's (lo, hi) range of `rows` (a
    model's `packed_rows`, `BATCH_ROWS`; None: `PACKED_ROWS`), else the plain call."""
    w = getattr(linear, "weight", None)
    if not use_packed or w is None:
        return linear(x)
    if x.shape[-2] <= ours_rows and ours_serves(linear):
        return ours(linear, x)
    lo, hi = (rows or PACKED_ROWS).get(w.dtype, (1 << 30, 0))
    packed = packed_weight(linear) if lo <= x.shape[-2] <= hi else None
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")
    return linear(x)


@contextlib.contextmanager
def _gemm_backend(rows: int):
    """Route one- and two-row matmuls away from oneDNN.

    On CPU, oneDNN's bf16 GEMM is slow for a single row: measured here, the 120 projection
    matmuls of a SmolLM2 decode step took 20.5 ms through oneDNN and 8.5 ms through ATen's own
    GEMV (with fp32 accumulation); from 4 rows on oneDNN wins (16.8 vs 22.6 ms). fp32 and fp16
    are unaffected. `python -m engine.bench dtypes` prints the figures on the machine at hand.
    """
    if rows > 2 or not torch.backends.mkldnn.is_available():
        yield
        return
    previous = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(previous)


def roped_heads(blk: Block, qkv: torch.Tensor, H: int, KV: int, D: int, cos, sin):
    """q, k, v as [1, heads, T, D] from the fused q/k/v projection's output ([1, T, ...]), with
    rotary positions applied to q and k in one pass (they sit side by side in that output)."""
    T = qkv.shape[1]
    qk = _rope(qkv[..., : blk.q_size + blk.kv_size].view(1, T, H + KV, D).transpose(1, 2), cos, sin)
    return qk[:, :H], qk[:, H:], qkv[..., blk.q_size + blk.kv_size :].view(1, T, KV, D).transpose(1, 2)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
