// Decode attention, AVX2 + FMA, fp32: one new token per sequence against its own KV cache.
//
// Why hand-written: a decode step attends one query row per sequence. SDPA then has a fixed cost a
// call at any short context, and a batch calls it once per sequence and layer, with two small copies
// per call to store the token's key and value; at long context it reads each KV head once per query
// head that shares it (GQA). Figures: docs/history.md. Here one call a layer serves every
// decode sequence of a batch: it stores their new keys and values and streams each KV head once for
// all its query heads. engine/kernels/cpu_attention.py checks it against SDPA and owns the fallback.
//
// Layout: caches [layers, 1, KV, capacity, D] fp32 (engine/model/kv_cache.py; decode_attention_kv: fp16, bf16, or
// int8 with scales [layers, 1, KV, capacity], read on the fly); q [R, H, D], k_new and v_new
// [R, KV, D] (any row and head strides, D contiguous); sequence b is row rows[b], its new token goes
// to position positions[b], and it attends over [0, positions[b]]. Query head h reads KV head h / G.
// A sequence's keys are cut into chunks of kChunk (flash-decoding): the chunks depend on its length
// only and merge in a fixed order, so its result is the same bits whatever else is in the batch; a
// thread takes consecutive chunks of one KV head a few at a time (a run), each keeping its own partial.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>
#include <torch/library.h>

#include "cpu_attention.h"
#include "cpu_stream.h"
#include "cpu_tiles.h"

namespace {

constexpr int64_t kChunk = 256;  // keys per chunk: 2 x 64 KB of K and V at D = 64, resident in L2
constexpr int64_t kMaxRun = 4;   // chunks per task at most (a task's scores: kMaxGroup x kMaxRun x kChunk floats)
constexpr int64_t kTasksPerThread = 3;  // runs as long as leave this many tasks a thread, to share them out
constexpr int kMaxGroup = 8;     // query heads per KV head served in registers
constexpr int kMaxDim = 256;     // head_dim up to this

#include "cpu_attention_chunk.inc"  // hsum, exp, the row loops and attend_run

template <typename F>
void by_group(int64_t G, F&& f) {
  switch (G) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

void check_rows(const at::Tensor& t, const char* name, int64_t heads, int64_t D) {
  TORCH_CHECK(t.dim() == 3 && t.size(1) == heads && t.size(2) == D && t.stride(2) == 1,
              name, " must be [R, ", heads, ", ", D, "] with its last dimension contiguous, got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.device().is_cpu(), name, " must be an fp32 CPU tensor");
}

// The new token's key or value (D fp32 values) into a cache row of type E: fp32 copied, fp16 and bf16
// rounded to nearest even (c10's conversions: torch's own .to()), int8 by the rule of
// engine/model/kv_cache.py quantize_int8 (scale = max|x| / 127, round half to even), its scale in *scale.
template <typename E>
void store_row(const float* x, int64_t D, E* dst, float* scale) {
  if constexpr (std::is_same_v<E, float>) {
    std::copy(x, x + D, dst);
  } else if constexpr (std::is_same_v<E, int8_t>) {
    float amax = 0.f;
    for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float s = amax / 127.0f;
    *scale = s;
    for (int64_t d = 0; d < D; ++d)
      dst[d] = s > 0.f ? static_cast<int8_t>(std::clamp(std::nearbyint(x[d] / s), -127.f, 127.f)) : 0;
  } else {
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<E>(x[d]);
  }
}

template <typename E>
at::Tensor attend_caches(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                         at::TensorList k_caches, at::TensorList v_caches, at::TensorList k_scales,
                         at::TensorList v_scales, at::IntArrayRef rows, at::IntArrayRef positions, int64_t layer,
                         double scale, const at::Tensor& into) {
  constexpr bool kInt8 = std::is_same_v<E, int8_t>;
  const int64_t B = static_cast<int64_t>(rows.size());
  TORCH_CHECK(B >= 1 && static_cast<int64_t>(positions.size()) == B && static_cast<int64_t>(k_caches.size()) == B &&
                  static_cast<int64_t>(v_caches.size()) == B,
              "rows, positions and both cache lists need one entry per sequence");
  TORCH_CHECK(!kInt8 || (static_cast<int64_t>(k_scales.size()) == B && static_cast<int64_t>(v_scales.size()) == B),
              "int8 caches need one scale tensor per cache");
  const int64_t H = q.size(1), D = q.size(2), KV = k_new.size(1), R = q.size(0);
  TORCH_CHECK(KV >= 1 && H % KV == 0 && H / KV <= kMaxGroup, "query heads must be 1 to ", kMaxGroup, " per KV head");
  TORCH_CHECK(D % 8 == 0 && D <= kMaxDim, "head_dim must be a multiple of 8 up to ", kMaxDim);
  check_rows(q, "q", H, D);
  check_rows(k_new, "k_new", KV, D);
  check_rows(v_new, "v_new", KV, D);
  TORCH_CHECK(k_new.size(0) == R && v_new.size(0) == R, "q, k_new and v_new need the same rows");
  const at::ScalarType type = k_caches[0].scalar_type();
  const int64_t G = H / KV;
  std::vector<E*> kp(B), vp(B);
  std::vector<float*> ksp(B, nullptr), vsp(B, nullptr);
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    for (const at::Tensor* c : {&k_caches[b], &v_caches[b]}) {
      TORCH_CHECK(c->dim() == 5 && c->size(1) == 1 && c->size(2) == KV && c->size(4) == D && c->is_contiguous() &&
                      c->scalar_type() == type && c->device().is_cpu(),
                  "caches must be contiguous [layers, 1, ", KV, ", capacity, ", D, "] CPU tensors of one dtype");
      TORCH_CHECK(layer >= 0 && layer < c->size(0), "layer ", layer, " out of range");
    }
    TORCH_CHECK(rows[b] >= 0 && rows[b] < R, "row ", rows[b], " out of range");
    TORCH_CHECK(positions[b] >= 0 && positions[b] < k_caches[b].size(3), "position ", positions[b], " beyond the cache");
    const int64_t cap = k_caches[b].size(3);
    kp[b] = k_caches[b].data_ptr<E>() + layer * KV * cap * D;
    vp[b] = v_caches[b].data_ptr<E>() + layer * KV * cap * D;
    if constexpr (kInt8) {
      for (const at::Tensor* c : {&k_scales[b], &v_scales[b]})
        TORCH_CHECK(c->dim() == 4 && c->size(0) == k_caches[b].size(0) && c->size(2) == KV && c->size(3) == cap &&
                        c->is_contiguous() && c->scalar_type() == at::kFloat,
                    "int8 scales must be contiguous fp32 [layers, 1, ", KV, ", capacity]");
      ksp[b] = k_scales[b].data_ptr<float>() + layer * KV * cap;
      vsp[b] = v_scales[b].data_ptr<float>() + layer * KV * cap;
    }
    for (int64_t h = 0; h < KV; ++h) {  // store the new token's key and value first: its own chunk reads them
      const float* ks = k_new.data_ptr<float>() + rows[b] * k_new.stride(0) + h * k_new.stride(1);
      const float* vs = v_new.data_ptr<float>() + rows[b] * v_new.stride(0) + h * v_new.stride(1);
      const int64_t at = h * cap + positions[b];
      store_row<E>(ks, D, kp[b] + at * D, kInt8 ? ksp[b] + at : nullptr);
      store_row<E>(vs, D, vp[b] + at * D, kInt8 ? vsp[b] + at : nullptr);
      for (int64_t s = 0; s <= positions[b]; s += kChunk)
        tasks.push_back({b, h, s, std::min(positions[b] + 1, s + kChunk)});
    }
  }
  const int64_t T = static_cast<int64_t>(tasks.size()), stride = G * (D + 2);
  std::vector<float> partials(T * stride);
  // A task is a run of consecutive chunks of one (sequence, KV head), read as two long streams
  // (attend_row_by_row); each chunk keeps its own partial, so a run's length never changes the bits.
  const int64_t run = std::clamp<int64_t>(T / (kTasksPerThread * at::get_num_threads()), 1, kMaxRun);
  std::vector<int64_t> firsts;  // each task's first chunk; its last is the next task's first, less one
  for (int64_t t = 0; t < T;) {
    firsts.push_back(t);
    const int64_t from = t;
    while (t < T && t - from < run && tasks[t].seq == tasks[from].seq && tasks[t].head == tasks[from].head) ++t;
  }
  firsts.push_back(T);
  tiles::run(static_cast<int64_t>(firsts.size()) - 1, [&](int64_t r) {  // shared out as tiles (cpu_tiles.h)
    alignas(64) float scores[kMaxGroup * kMaxRun * kChunk];
    const int64_t t = firsts[r];
    const Task& tk = tasks[t];
    const int64_t cap = k_caches[tk.seq].size(3);
    const float* qs[kMaxGroup];
    for (int64_t g = 0; g < G; ++g)
      qs[g] = q.data_ptr<float>() + rows[tk.seq] * q.stride(0) + (tk.head * G + g) * q.stride(1);
    const E* k = kp[tk.seq] + tk.head * cap * D;
    const E* v = vp[tk.seq] + tk.head * cap * D;
    const float* ks = kInt8 ? ksp[tk.seq] + tk.head * cap : nullptr;
    const float* vs = kInt8 ? vsp[tk.seq] + tk.head * cap : nullptr;
    by_group(G, [&](auto g) {
      attend_run<decltype(g)::value, E>(qs, k, v, ks, vs, D, tk.begin, tasks[firsts[r + 1] - 1].end,
                                        static_cast<float>(scale), scores, partials.data() + t * stride, stride);
    });
  });
  at::Tensor out = into;
  if (out.defined()) {
    TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == B * H * D,
                "out: contiguous fp32 [sequences, ", H, ", ", D, "]");
  } else {
    out = at::empty({B, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  }
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < T;) {  // merge each (sequence, KV head)'s chunks in order
    int64_t e = t;
    while (e < T && tasks[e].seq == tasks[t].seq && tasks[e].head == tasks[t].head) ++e;
    for (int64_t g = 0; g < G; ++g) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = t; c < e; ++c) m = std::max(m, partials[c * stride + g * (D + 2)]);
      float total = 0.f;
      float* o = op + (tasks[t].seq * H + tasks[t].head * G + g) * D;
      std::fill(o, o + D, 0.f);
      for (int64_t c = t; c < e; ++c) {
        const float* p = partials.data() + c * stride + g * (D + 2);
        const float w = std::exp(p[0] - m);
        total += w * p[1];
        for (int64_t d = 0; d < D; ++d) o[d] += w * p[2 + d];
      }
      const float inv = 1.f / total;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
    t = e;
  }
  return out;
}

// fp32 caches (the model's dtype).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                            at::TensorList k_caches, at::TensorList v_caches, at::IntArrayRef rows,
                            at::IntArrayRef positions, int64_t layer, double scale) {
  TORCH_CHECK(!k_caches.empty() && k_caches[0].scalar_type() == at::kFloat, "caches must be fp32");
  return attention::decode(q, k_new, v_new, k_caches, v_caches, {}, {}, rows, positions, layer, scale);
}

// Caches kept at another precision than the model's (the kv_cache_dtype toggle): fp16, bf16, or int8 with
// one fp32 scale per head per position (k_scales, v_scales; empty lists for the 16-bit types). Each row is
// widened to fp32 as it is read, the int8 scale applied to its score and its value weight.
at::Tensor decode_attention_kv(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                               at::TensorList k_caches, at::TensorList v_caches, at::TensorList k_scales,
                               at::TensorList v_scales, at::IntArrayRef rows, at::IntArrayRef positions,
                               int64_t layer, double scale) {
  TORCH_CHECK(!k_caches.empty(), "no caches");
  TORCH_CHECK(k_caches[0].scalar_type() != at::kFloat, "decode_attention_kv takes fp16, bf16 or int8 caches, not ",
              k_caches[0].scalar_type());
  return attention::decode(q, k_new, v_new, k_caches, v_caches, k_scales, v_scales, rows, positions, layer, scale);
}

}  // namespace

at::Tensor attention::decode(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                             at::TensorList k_caches, at::TensorList v_caches, at::TensorList k_scales,
                             at::TensorList v_scales, at::IntArrayRef rows, at::IntArrayRef positions, int64_t layer,
                             double scale, const at::Tensor& out) {
  TORCH_CHECK(!k_caches.empty(), "no caches");
  switch (k_caches[0].scalar_type()) {
    case at::kFloat:
      return attend_caches<float>(q, k_new, v_new, k_caches, v_caches, {}, {}, rows, positions, layer, scale, out);
    case at::kHalf:
      return attend_caches<c10::Half>(q, k_new, v_new, k_caches, v_caches, {}, {}, rows, positions, layer, scale, out);
    case at::kBFloat16:
      return attend_caches<c10::BFloat16>(q, k_new, v_new, k_caches, v_caches, {}, {}, rows, positions, layer, scale,
                                          out);
    case at::kChar:
      return attend_caches<int8_t>(q, k_new, v_new, k_caches, v_caches, k_scales, v_scales, rows, positions, layer,
                                   scale, out);
    default:
      TORCH_CHECK(false, "decode attention takes fp32, fp16, bf16 or int8 caches, not ", k_caches[0].scalar_type());
  }
}

void attention::store_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales) {
  TORCH_CHECK(x.dim() == 4 && x.sizes() == q.sizes() && scales.dim() == 3 && scales.sizes() == x.sizes().slice(0, 3) &&
                  x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat &&
                  x.stride(3) == 1 && q.stride(3) == 1,
              "store_int8: x fp32 and q int8 [A, B, n, D] (D contiguous), scales fp32 [A, B, n]");
  const int64_t D = x.size(3);
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  for (int64_t a = 0; a < x.size(0); ++a)
    for (int64_t b = 0; b < x.size(1); ++b)
      for (int64_t j = 0; j < x.size(2); ++j)
        store_row<int8_t>(xp + a * x.stride(0) + b * x.stride(1) + j * x.stride(2), D,
                          qp + a * q.stride(0) + b * q.stride(1) + j * q.stride(2),
                          sp + a * scales.stride(0) + b * scales.stride(1) + j * scales.stride(2));
}

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("decode_attention(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, "
        "int[] rows, int[] positions, int layer, float scale) -> Tensor");
  m.def("decode_attention_kv(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, "
        "Tensor(c!)[] k_scales, Tensor(d!)[] v_scales, int[] rows, int[] positions, int layer, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(latency_lab_gemv, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("decode_attention_kv", &decode_attention_kv);
}
