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
// down's; a projection's weights are `kind`'s: 0, panels for fp32 rows (engine/kernels/cpu_gemm.py fp32_panels:
// of fp32 weights, or of bf16wo's bf16 ones, widened exactly in fp32_mm); 1, int8 weights and fp32 scales; 2,
// 4-bit groups with their fp16 scales and offsets (the w8a layers of engine/quant/w8a.py, through cpu_fused.cpp's
// projections in form `isa`). biases: per layer 4 (q/k/v, o,
// gate/up, down), undefined where none. outs: the 4 projections' output sizes. Sequence b brings
// lengths[b] rows from row offsets[b], at positions from starts[b]; `decode` lists the sequences
// whose single row goes through our decode attention kernel, `others` those through SDPA with
// masks[b] (engine/runtime/eager.py makes both lists and the masks). A cache may be kept at another
// precision than the model's (the kv_cache_dtype toggle, engine/model/kv_cache.py: fp16, bf16, or int8 with
// k_scales[b], v_scales[b]): its decode row goes through decode_attention_kv, its other rows are stored and
// read back as KVCache.store and read do, op for op.
//
// The ends of a step, where the caller gives them: `embed` (the model's embedding table; where the call asks
// (`embed`), x holds the token ids, [R] int64, and each row is copied from the table) and `head` (a w8a lm_head's
// weights, with the final norm folded into its quantizer: engine/quant/w8a.py normed_product, the plan's
// head_norm), so that a decode step is one call: each Python op between the layers and the head cost ~10-50 us a
// step with the caches cold from the weights' stream (docs/quantization-w8a-2026-12-06.md). With `logits` (and a
// head) it returns each sequence's last row's logits, [B, vocab] fp32, else x after the last layer.
//
// What a model's forwards all read (the weights above, the sizes, the ends) is one `Layers` object, made once a
// runner (engine/kernels/cpu_layers.py layer_weights), and the call is a plain Python binding, not a torch op: an
// op's call converted its ~300 listed tensors and options each way and checked every argument for
// __torch_function__, a share of a one-row step that grew with the model (docs/quantization-w8a-2026-12-07.md,
// "The call"). Nothing traces it: the compiled step runs the Python loop.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>

#include "cpu_attention.h"
#include "cpu_qdot_ops.h"
#include "cpu_tiles.h"

namespace {

struct Kind {
  int64_t kind, isa;
  bool wide;
  int64_t tensors() const { return kind == 1 ? 2 : 1; }  // a projection's weight tensors
  int64_t per_layer() const { return 2 + 4 * tensors(); }  // a layer's: two norms and four projections
};

// What run_layers reads a forward, gathered once (the fields as batch_layers' comment above names them).
struct Layers {
  std::vector<at::Tensor> weights;
  std::vector<std::optional<at::Tensor>> biases;
  std::vector<int64_t> outs;
  double eps, scale;
  int64_t H, KV, D, q_size, kv_size, kind, isa;
  bool wide;
  std::optional<at::Tensor> embed, head_norm, head_bias;
  std::vector<at::Tensor> head;
  double head_eps;
  int64_t head_kind, head_isa;

  Layers(std::vector<at::Tensor> w, std::vector<std::optional<at::Tensor>> b, std::vector<int64_t> o, double e,
         int64_t h, int64_t kv, int64_t d, int64_t q, int64_t kvs, double sc, bool wd, int64_t k, int64_t i,
         std::optional<at::Tensor> emb, std::vector<at::Tensor> hd, std::optional<at::Tensor> hn, double he,
         int64_t hk, int64_t hi, std::optional<at::Tensor> hb)
      : weights(std::move(w)), biases(std::move(b)), outs(std::move(o)), eps(e), scale(sc), H(h), KV(kv), D(d),
        q_size(q), kv_size(kvs), kind(k), isa(i), wide(wd), embed(std::move(emb)), head_norm(std::move(hn)),
        head_bias(std::move(hb)), head(std::move(hd)), head_eps(he), head_kind(hk), head_isa(hi) {
    TORCH_CHECK(kind >= 0 && kind <= 2, "Layers: kind 0 (fp32 or bf16 panels), 1 (int8w8a) or 2 (int4w8a)");
    TORCH_CHECK(head.empty() || (head_norm.has_value() && (head_kind == 1 || head_kind == 2) &&
                                 static_cast<int64_t>(head.size()) == Kind{head_kind, head_isa, wide}.tensors()),
                "Layers: a head is a w8a layer's weights (kind 1: int8 and scales; 2: 4-bit groups) and its norm");
    const int64_t per = Kind{kind, isa, wide}.per_layer(), L = static_cast<int64_t>(weights.size()) / per;
    TORCH_CHECK(static_cast<int64_t>(weights.size()) == per * L && static_cast<int64_t>(biases.size()) == 4 * L &&
                    outs.size() == 4,
                "Layers: ", per, " weights and 4 biases a layer, 4 output sizes");
    TORCH_CHECK(!embed.has_value() || (embed->dim() == 2 && embed->is_contiguous() && embed->scalar_type() == at::kFloat),
                "Layers: the embedding table: contiguous fp32 [vocab, hidden]");
  }
};

// The embedding's rows for token ids `ids` [R] (int64): each row of the fp32 table copied, the bits
// nn.Embedding's forward gives, without at::embedding's op call (its index_select's set-up cost a one-row step
// more than the copy: docs/quantization-w8a-2026-12-07.md, "The call").
at::Tensor embedded(const at::Tensor& table, const at::Tensor& ids) {
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, "batch_layers: with an embedding table, x holds the token ids [R] (int64)");
  const at::Tensor idx = ids.contiguous();
  const int64_t R = idx.size(0), vocab = table.size(0), hidden = table.size(1);
  at::Tensor x = at::empty({1, R, hidden}, table.options());
  const int64_t* id = idx.data_ptr<int64_t>();
  const float* rows = table.data_ptr<float>();
  float* out = x.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(id[r] >= 0 && id[r] < vocab, "token id ", id[r], " is outside the vocabulary [0, ", vocab, ")");
    std::memcpy(out + r * hidden, rows + id[r] * hidden, hidden * sizeof(float));
  }
  return x;
}

// cpu_gemm.ours (fp32 or bf16 panels, fp32 rows): x [R, K] -> [R, n]
at::Tensor mm(const at::Tensor& x, const at::Tensor* w, int64_t n, const std::optional<at::Tensor>& bias, Kind k) {
  static auto fp32 = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("latency_lab_gemv::fp32_mm", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  at::Tensor y = fp32.call(x.contiguous(), w[0], n, k.wide);
  if (bias.has_value() && bias->defined()) y = at::add(y, *bias);
  return y;
}

// The decode sequences whose caches share a storage type (fp32: the model's dtype; fp16, bf16, or int8 with its
// scales: the kv_cache_dtype toggle), their rows and positions; `index` the rows as a tensor.
struct Decode {
  std::vector<at::Tensor> kc, vc, ks, vs;
  std::vector<int64_t> rows, positions;
  at::Tensor index;
};

// A decode group through our attention kernel (cpu_attention.h: a direct call, no dispatcher look-up; the ops
// decode_attention and decode_attention_kv that engine/runtime/eager.py picks run the same function, by the
// caches' dtype): q [R, H, D], k and v [R, KV, D] as rope_qk and the q/k/v output lay them (rows and heads
// strided, no copies); into `out` where defined, else a new [rows, H, D].
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Decode& g,
                            int64_t layer, double scale, const at::Tensor& out = at::Tensor()) {
  return attention::decode(q, k, v, g.kc, g.vc, g.ks, g.vs, g.rows, g.positions, layer, scale, out);
}

// Sequence b's n new keys and values (k, v: [1, KV, n, D]) stored at positions [s, s + n) of `layer`, and its keys
// and values [0, s + n) read back in fp32: engine/model/kv_cache.py KVCache.store and read, op for op (fp32: the
// slice assignment and views; fp16/bf16: rounded in, widened out; int8: quantize_int8's rule in (cpu_attention.h
// store_int8, the decode rows' quantizer), times the scales out).
std::pair<at::Tensor, at::Tensor> store_read(const at::Tensor& kc, const at::Tensor& vc,
                                             const std::optional<at::Tensor>& ks, const std::optional<at::Tensor>& vs,
                                             int64_t layer, const at::Tensor& k, const at::Tensor& v, int64_t s,
                                             int64_t n) {
  at::Tensor kl = kc.select(0, layer), vl = vc.select(0, layer);
  if (kc.scalar_type() != at::kChar) {
    kl.slice(2, s, s + n).copy_(k);
    vl.slice(2, s, s + n).copy_(v);
    at::Tensor keys = kl.slice(2, 0, s + n), values = vl.slice(2, 0, s + n);
    if (kc.scalar_type() == at::kFloat) return {keys, values};
    return {keys.to(at::kFloat), values.to(at::kFloat)};
  }
  TORCH_CHECK(ks.has_value() && vs.has_value(), "batch_layers: an int8 cache needs its scales");
  at::Tensor ksl = ks->select(0, layer), vsl = vs->select(0, layer);
  attention::store_int8(k, kl.slice(2, s, s + n), ksl.slice(2, s, s + n));  // the decode rows' own quantizer
  attention::store_int8(v, vl.slice(2, s, s + n), vsl.slice(2, s, s + n));
  return {kl.slice(2, 0, s + n).to(at::kFloat) * ksl.slice(2, 0, s + n).unsqueeze(-1),
          vl.slice(2, 0, s + n).to(at::kFloat) * vsl.slice(2, 0, s + n).unsqueeze(-1)};
}

// What a forward's layers write, allocated once a call and reused by every layer (a one-row step made ~40
// ATen calls a layer, most of them allocations and views, before: issue 41), with the views the loop reads
// made once too. The residual stream x is updated in place (y = x + (product + bias), element by element:
// the same bits as the new tensor the Python loop makes).
struct Workspace {
  at::Tensor x;        // [R, hidden]: the residual stream (a copy of the caller's x, not written; or the embedding's rows)
  at::Tensor qkv;      // [R, q + 2 kv]: the fused q/k/v projection
  at::Tensor roped;    // [R, H + KV, D]: q and k with rotary positions
  at::Tensor attn;     // [R, H, D]: the attention output
  at::Tensor gate_up;  // [R, 2 I] (w8a layers; the fp32 panels' product returns its own)
  qdot::Scratch scratch;  // the w8a projections' temporaries (cpu_qdot_ops.h)
  // views of the above: q, k, v as the decode kernel reads them ([R, heads, D]) and as SDPA does ([1, heads, R,
  // D]), the attention's rows [R, H * D], gate/up's halves
  at::Tensor q, k, v, q4, k4, v4, attn_rows, gate, up;

  Workspace(const at::Tensor& x0, bool fresh, at::IntArrayRef outs, int64_t H, int64_t KV, int64_t D, int64_t q_size,
            int64_t kv_size, bool w8a) {
    const int64_t R = x0.size(1), hidden = x0.size(2), I = outs[2] / 2;
    const at::TensorOptions f = x0.options().dtype(at::kFloat);
    x = fresh ? x0.view({R, hidden}) : x0.reshape({R, hidden}).clone(at::MemoryFormat::Contiguous);
    qkv = at::empty({R, outs[0]}, f);
    roped = at::empty({R, H + KV, D}, f);
    attn = at::empty({R, H, D}, f);
    q = roped.narrow(1, 0, H);
    k = roped.narrow(1, H, KV);
    v = qkv.narrow(1, q_size + kv_size, kv_size).view({R, KV, D});
    q4 = q.transpose(0, 1).unsqueeze(0);
    k4 = k.transpose(0, 1).unsqueeze(0);
    v4 = v.transpose(0, 1).unsqueeze(0);
    attn_rows = attn.view({R, H * D});
    if (!w8a) return;
    gate_up = at::empty({R, outs[2]}, f);
    gate = gate_up.narrow(1, 0, I);
    up = gate_up.narrow(1, I, I);
    int64_t bytes = 0;  // the quantized activations of the widest input
    for (int64_t K : {hidden, H * D, I}) bytes = std::max(bytes, R * qdot::Quantized::bytes(qdot::Layout(K, true)));
    scratch = {at::empty({bytes}, f.dtype(at::kByte)), at::empty({R, hidden}, f),
               qdot::silu_matches() ? at::Tensor() : at::empty({R, I}, f)};  // silu(gate) only where at::silu serves
  }
};

at::Tensor batch_layers(const Layers& m, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const std::vector<at::Tensor>& k_caches, const std::vector<at::Tensor>& v_caches,
                        const std::vector<std::optional<at::Tensor>>& k_scales,
                        const std::vector<std::optional<at::Tensor>>& v_scales, const std::vector<int64_t>& starts,
                        const std::vector<int64_t>& lengths, const std::vector<int64_t>& offsets,
                        const std::vector<int64_t>& decode, const std::vector<int64_t>& others,
                        const std::vector<std::optional<at::Tensor>>& masks, bool embed, bool logits) {
  const auto& weights = m.weights;
  const auto& biases = m.biases;
  const at::IntArrayRef outs = m.outs;
  const double eps = m.eps, scale = m.scale;
  const int64_t H = m.H, KV = m.KV, D = m.D, q_size = m.q_size, kv_size = m.kv_size, kind = m.kind, isa = m.isa;
  const at::TensorList head = logits ? at::TensorList(m.head) : at::TensorList();
  TORCH_CHECK(!embed || m.embed.has_value(), "batch_layers: embed asked of Layers without an embedding table");
  const at::Tensor x0 = embed ? embedded(*m.embed, x) : x;
  const Kind how{kind, isa, m.wide};
  const int64_t T = how.tensors(), per = how.per_layer();
  const int64_t L = static_cast<int64_t>(weights.size()) / per, hidden = x0.size(2);
  TORCH_CHECK(static_cast<int64_t>(masks.size()) == static_cast<int64_t>(starts.size()),
              "batch_layers: a mask (or None) per sequence");
  TORCH_CHECK(x0.dim() == 3 && x0.size(0) == 1 && x0.scalar_type() == at::kFloat, "batch_layers: x fp32 [1, R, hidden]");
  TORCH_CHECK(k_scales.size() == starts.size() && v_scales.size() == starts.size(),
              "batch_layers: a k and a v scale tensor (int8 caches) or None per sequence");
  auto scales = [](const std::vector<std::optional<at::Tensor>>& l, int64_t b) { return l[b]; };
  std::vector<Decode> groups;  // the decode sequences by their caches' storage type, in order of first appearance
  for (int64_t b : decode) {
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const Decode& d) { return d.kc[0].scalar_type() == k_caches[b].scalar_type(); });
    if (g == groups.end()) g = groups.insert(groups.end(), Decode{});
    g->kc.push_back(k_caches[b]);
    g->vc.push_back(v_caches[b]);
    if (k_caches[b].scalar_type() == at::kChar) {
      TORCH_CHECK(scales(k_scales, b).has_value() && scales(v_scales, b).has_value(),
                  "batch_layers: an int8 cache needs its scales");
      g->ks.push_back(*scales(k_scales, b));
      g->vs.push_back(*scales(v_scales, b));
    }
    g->rows.push_back(offsets[b]);
    g->positions.push_back(starts[b]);
  }
  for (Decode& g : groups) g.index = at::tensor(g.rows, at::TensorOptions().dtype(at::kLong));
  const bool gqa = H != KV, w8a = how.kind != 0;
  Workspace ws(x0, embed, outs, H, KV, D, q_size, kv_size, w8a);
  const qdot::Scratch* scratch = &ws.scratch;
  const at::Tensor none;
  auto layer = [&](int64_t i) {
    const at::Tensor* w = weights.data() + per * i;  // [attn norm, qkv (T), o (T), mlp norm, gate/up (T), down (T)]
    const at::Tensor *qkv_w = w + 1, *o_w = w + 1 + T, &mlp_norm = w[1 + 2 * T], *gate_up_w = w + 2 + 2 * T,
                     *down_w = w + 2 + 3 * T;
    auto bias = [&](int64_t j) -> const std::optional<at::Tensor>& { return biases[4 * i + j]; };
    auto given = [&](int64_t j) { const auto& o = bias(j); return o.has_value() ? *o : none; };  // undefined: none
    if (w8a)
      qdot::project_into(ws.x, &w[0], eps, nullptr, qkv_w, kind, isa, given(0), none, scratch, ws.qkv);
    else
      ws.qkv.copy_(mm(at::rms_norm(ws.x, {hidden}, w[0], eps), qkv_w, outs[0], bias(0), how));
    qdot::rope_qk(ws.qkv, cos, sin, H, KV, D, ws.roped);  // q and k roped: cpu_fused.cpp, torch's bits
    if (others.empty() && groups.size() == 1) {  // decode only, one precision: rows are sequences, in order
      decode_attention(ws.q, ws.k, ws.v, groups[0], i, scale, ws.attn);
    } else {
      const at::Tensor &q = ws.q4, &k = ws.k4, &v = ws.v4, &attn = ws.attn;
      for (const Decode& g : groups) attn.index_put_({g.index}, decode_attention(ws.q, ws.k, ws.v, g, i, scale));
      for (int64_t b : others) {
        const int64_t s = starts[b], n = lengths[b], row = offsets[b];
        auto [keys, values] = store_read(k_caches[b], v_caches[b], scales(k_scales, b), scales(v_scales, b), i,
                                         k.slice(2, row, row + n), v.slice(2, row, row + n), s, n);
        attn.slice(0, row, row + n)
            .copy_(at::scaled_dot_product_attention(q.slice(2, row, row + n), keys, values, masks[b], 0.0,
                                                    n > 1 && s == 0, scale, gqa)
                       .select(0, 0)
                       .transpose(0, 1));
      }
    }
    if (w8a) {  // x += o(attn); x += down(silu(gate) * up), gate/up from the normed x: in place, into the workspace
      qdot::project_into(ws.attn_rows, nullptr, eps, nullptr, o_w, kind, isa, given(1), ws.x, scratch, ws.x);
      qdot::project_into(ws.x, &mlp_norm, eps, nullptr, gate_up_w, kind, isa, given(2), none, scratch, ws.gate_up);
      qdot::project_into(ws.gate, nullptr, eps, &ws.up, down_w, kind, isa, given(3), ws.x, scratch, ws.x);
      return;
    }
    ws.x.add_(mm(ws.attn_rows, o_w, outs[1], bias(1), how));
    at::Tensor gate_up = mm(at::rms_norm(ws.x, {hidden}, mlp_norm, eps), gate_up_w, outs[2], bias(2), how);
    auto halves = gate_up.chunk(2, -1);
    ws.x.add_(mm(at::mul(at::silu(halves[0]), halves[1]), down_w, outs[3], bias(3), how));
  };
  // Each sequence's last row, normed in the head's quantizer and through its product (w8a.py normed_product's
  // call, with the workspace's scratch: the same bits).
  at::Tensor out;
  auto last_rows = [&] {
    const int64_t B = static_cast<int64_t>(starts.size());
    if (B == ws.x.size(0)) return ws.x;  // one row a sequence, in order
    std::vector<int64_t> rows(B);
    for (int64_t b = 0; b < B; ++b) rows[b] = offsets[b] + lengths[b] - 1;
    return ws.x.index_select(0, at::tensor(rows, at::TensorOptions().dtype(at::kLong)));
  };
  auto layers = [&] {
    for (int64_t i = 0; i < L; ++i) layer(i);
    if (!head.empty())
      out = qdot::project_into(last_rows(), &*m.head_norm, m.head_eps, nullptr, head.data(), m.head_kind, m.head_isa,
                               m.head_bias.value_or(none), none, w8a ? scratch : nullptr, none);
  };
  // A w8a decode step (one row block, one attention group) holds one OpenMP team for all its layers
  // (cpu_tiles.h Team): its ~150 small parallel calls no longer each open a parallel region. The same
  // calls, the same tiles, the same bits.
  const bool team = w8a && others.empty() && groups.size() == 1 && ws.x.size(0) <= qdot::kMaxRows &&
                    at::get_num_threads() > 1 && !at::in_parallel_region();
  if (team)
    tiles::Team::lead(at::get_num_threads(), layers);
  else
    layers();
  return head.empty() ? ws.x.view({1, ws.x.size(0), hidden}) : out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  py::class_<Layers, std::shared_ptr<Layers>>(m, "Layers")
      .def(py::init<std::vector<at::Tensor>, std::vector<std::optional<at::Tensor>>, std::vector<int64_t>, double,
                    int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, int64_t, int64_t,
                    std::optional<at::Tensor>, std::vector<at::Tensor>, std::optional<at::Tensor>, double, int64_t,
                    int64_t, std::optional<at::Tensor>>())
      .def_readonly("kind", &Layers::kind)  // what the loop was told: the tests read them
      .def_readonly("isa", &Layers::isa)
      .def_readonly("head_isa", &Layers::head_isa);
  // the interpreter lock let go for the whole forward, as a torch op's call does
  m.def("batch_layers", &batch_layers, py::call_guard<py::gil_scoped_release>());
}
