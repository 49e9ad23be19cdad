// The decoder layers of a forward (engine/runtime/eager.py, for a batch of sequences or one
// sequence) in one call: the same ATen ops and our kernels, on the same tensors, in the same order as
// the Python loop, or fused ops that give their very bits (cpu_fused.cpp: rotary positions; for the
// w8a layers the norms, silu(gate) * up, biases and residual adds around each projection), so the
// same bits.
//
// Why in C++: the Python loop makes ~20 op calls a layer, ~600 a forward. Each releases the
// interpreter lock and takes it back; in the server the HTTP thread holds it between, and while the
// model thread waits the OpenMP team goes to sleep and must be woken for the next product, so a
// batched forward took longer in the server than alone (docs/batching.md). Here the lock is
// released once for the whole forward.
//
// weights: per layer, the attention norm weight, q/k/v's weights, o's, the MLP norm weight, gate/up's,
// down's; a projection's weights are `kind`'s: 0, fp32 panels (engine/kernels/cpu_gemm.py:
// fp32_panels); 1, int8 weights and fp32 scales; 2, 4-bit rows with their fp16 scales and offsets (the w8a
// layers of engine/quant/w8a.py, through cpu_fused.cpp's projections in form `isa`). biases: per layer 4 (q/k/v, o,
// gate/up, down), undefined where none. outs: the 4 projections' output sizes. Sequence b brings
// lengths[b] rows from row offsets[b], at positions from starts[b]; `decode` lists the sequences
// whose single row goes through our decode attention kernel, `others` those through SDPA with
// masks[b] (engine/runtime/eager.py makes both lists and the masks).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "cpu_qdot_ops.h"

namespace {

struct Kind {
  int64_t kind, isa;
  bool wide;
  int64_t tensors() const { return kind == 1 ? 2 : 1; }  // a projection's weight tensors
};

// cpu_gemm.ours (fp32 panels): x [1, R, K] -> [1, R, n]
at::Tensor mm(const at::Tensor& x, const at::Tensor* w, int64_t n, const std::optional<at::Tensor>& bias, Kind k) {
  static auto fp32 = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("latency_lab_gemv::fp32_mm", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  at::Tensor y = fp32.call(x.reshape({-1, x.size(-1)}).contiguous(), w[0], n, k.wide);
  if (bias.has_value() && bias->defined()) y = at::add(y, *bias);
  return y.view({x.size(0), x.size(1), y.size(-1)});
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<at::Tensor>& kc, const std::vector<at::Tensor>& vc,
                            const std::vector<int64_t>& rows, const std::vector<int64_t>& positions, int64_t layer,
                            double scale) {  // cpu_attention.decode_attention_heads
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("latency_lab_gemv::decode_attention", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList,
                                         at::TensorList, at::IntArrayRef, at::IntArrayRef, int64_t, double)>();
  auto heads = [](const at::Tensor& t) {
    at::Tensor r = t.select(0, 0).transpose(0, 1);
    return r.stride(-1) == 1 ? r : r.contiguous();
  };
  return op.call(heads(q), heads(k), heads(v), kc, vc, rows, positions, layer, scale);
}

// A w8a projection (kind 1 or 2) through cpu_fused.cpp: the layer's norm, or silu(gate) * up, quantized
// on the way in; its bias and the residual added on the way out. x, up, residual: [1, R, .] -> [1, R, n].
at::Tensor project(const at::Tensor& x, const at::Tensor* norm, double eps, const at::Tensor* up, const at::Tensor* w,
                   const std::optional<at::Tensor>& bias, const at::Tensor* residual, Kind k) {
  const int64_t R = x.size(1);
  auto rows = [R](const at::Tensor& t) { return t.view({R, t.size(-1)}); };  // [1, R, .] -> [R, .] (a view)
  auto opt = [&](const at::Tensor* t) { return t ? std::optional<at::Tensor>(rows(*t)) : std::nullopt; };
  const std::optional<at::Tensor> b = bias.has_value() && bias->defined() ? bias : std::nullopt;
  at::Tensor y = qdot::project(rows(x), norm ? std::optional<at::Tensor>(*norm) : std::nullopt, eps, opt(up),
                               at::TensorList(w, k.tensors()), k.kind, k.isa, b, opt(residual));
  return y.view({1, R, y.size(-1)});
}

at::Tensor batch_layers(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, at::TensorList weights,
                        const c10::List<std::optional<at::Tensor>>& biases, at::IntArrayRef outs, double eps,
                        int64_t H, int64_t KV, int64_t D, int64_t q_size, int64_t kv_size, double scale,
                        at::TensorList k_caches, at::TensorList v_caches, at::IntArrayRef starts,
                        at::IntArrayRef lengths, at::IntArrayRef offsets, at::IntArrayRef decode,
                        at::IntArrayRef others, const c10::List<std::optional<at::Tensor>>& masks, bool wide,
                        int64_t kind, int64_t isa) {
  TORCH_CHECK(kind >= 0 && kind <= 2, "batch_layers: kind 0 (fp32 panels), 1 (int8w8a) or 2 (int4w8a)");
  const Kind how{kind, isa, wide};
  const int64_t T = how.tensors(), per = 2 + 4 * T;  // two norms and four projections a layer
  const int64_t L = static_cast<int64_t>(weights.size()) / per, R = x.size(1), hidden = x.size(2);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == per * L && static_cast<int64_t>(biases.size()) == 4 * L &&
                  outs.size() == 4 && static_cast<int64_t>(masks.size()) == static_cast<int64_t>(starts.size()),
              "batch_layers: ", per, " weights and 4 biases a layer, 4 output sizes, a mask (or None) per sequence");
  std::vector<at::Tensor> dk, dv;  // the decode sequences' caches, rows and positions
  std::vector<int64_t> drows, dpos;
  for (int64_t b : decode) {
    dk.push_back(k_caches[b]);
    dv.push_back(v_caches[b]);
    drows.push_back(offsets[b]);
    dpos.push_back(starts[b]);
  }
  const at::Tensor decode_rows = at::tensor(drows, at::TensorOptions().dtype(at::kLong));
  const bool gqa = H != KV;
  for (int64_t i = 0; i < L; ++i) {
    const at::Tensor* w = weights.data() + per * i;  // [attn norm, qkv (T), o (T), mlp norm, gate/up (T), down (T)]
    const at::Tensor *qkv_w = w + 1, *o_w = w + 1 + T, &mlp_norm = w[1 + 2 * T], *gate_up_w = w + 2 + 2 * T,
                     *down_w = w + 2 + 3 * T;
    auto bias = [&](int64_t j) { return biases.get(4 * i + j); };
    const bool w8a = how.kind != 0;
    const at::Tensor qkv = w8a ? project(x, &w[0], eps, nullptr, qkv_w, bias(0), nullptr, how)
                               : mm(at::rms_norm(x, {hidden}, w[0], eps), qkv_w, outs[0], bias(0), how);
    // q and k roped ([R, H + KV, D], cpu_fused.cpp: torch's bits), seen as [1, heads, R, D] like the Python loop's
    at::Tensor qk = qdot::rope_qk(qkv.view({R, qkv.size(-1)}), cos, sin, H, KV, D).view({1, R, H + KV, D}).transpose(1, 2);
    at::Tensor q = qk.slice(1, 0, H), k = qk.slice(1, H);
    at::Tensor v = qkv.slice(-1, q_size + kv_size).view({1, R, KV, D}).transpose(1, 2);
    at::Tensor attn;
    if (others.empty()) {  // decode only: rows are sequences, in order
      attn = decode_attention(q, k, v, dk, dv, drows, dpos, i, scale);
    } else {
      attn = at::empty({R, H, D}, q.options());
      if (!decode.empty()) attn.index_put_({decode_rows}, decode_attention(q, k, v, dk, dv, drows, dpos, i, scale));
      for (int64_t b : others) {
        const int64_t s = starts[b], n = lengths[b], row = offsets[b];
        at::Tensor kl = k_caches[b].select(0, i), vl = v_caches[b].select(0, i);
        kl.slice(2, s, s + n).copy_(k.slice(2, row, row + n));
        vl.slice(2, s, s + n).copy_(v.slice(2, row, row + n));
        attn.slice(0, row, row + n)
            .copy_(at::scaled_dot_product_attention(q.slice(2, row, row + n), kl.slice(2, 0, s + n),
                                                    vl.slice(2, 0, s + n), masks.get(b), 0.0, n > 1 && s == 0,
                                                    scale, gqa)
                       .select(0, 0)
                       .transpose(0, 1));
      }
    }
    if (w8a) {
      x = project(attn.reshape({1, R, H * D}), nullptr, eps, nullptr, o_w, bias(1), &x, how);
      at::Tensor gate_up = project(x, &mlp_norm, eps, nullptr, gate_up_w, bias(2), nullptr, how);
      auto halves = gate_up.chunk(2, -1);
      x = project(halves[0], nullptr, eps, &halves[1], down_w, bias(3), &x, how);
      continue;
    }
    x = at::add(x, mm(attn.reshape({1, R, H * D}), o_w, outs[1], bias(1), how));
    at::Tensor gate_up = mm(at::rms_norm(x, {hidden}, mlp_norm, eps), gate_up_w, outs[2], bias(2), how);
    auto halves = gate_up.chunk(2, -1);
    x = at::add(x, mm(at::mul(at::silu(halves[0]), halves[1]), down_w, outs[3], bias(3), how));
  }
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("batch_layers(Tensor x, Tensor cos, Tensor sin, Tensor[] weights, Tensor?[] biases, int[] outs, float eps, "
        "int H, int KV, int D, int q_size, int kv_size, float scale, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, "
        "int[] starts, int[] lengths, int[] offsets, int[] decode, int[] others, Tensor?[] masks, bool wide, "
        "int kind=0, int isa=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(latency_lab_gemv, CPU, m) { m.impl("batch_layers", &batch_layers); }
