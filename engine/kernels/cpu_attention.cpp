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
// only and merge in a fixed order, so its result is the same bits whatever else is in the batch.
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

namespace {

constexpr int64_t kChunk = 256;  // keys per task: 2 x 64 KB of K and V at D = 64, resident in L2
constexpr int kMaxGroup = 8;     // query heads per KV head served in registers
constexpr int kMaxDim = 256;     // head_dim up to this

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp for x <= 0 (scores minus their max): 2^n * p(r), r in [-ln2/2, ln2/2], Cephes' polynomial
// (relative error ~2e-7); below -87 it returns 0, as the float result underflows there anyway.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

struct Task {
  int64_t seq, head, begin, end;  // KV head `head` of sequence `seq`, keys [begin, end)
};

// How a cache row's 8 elements load as fp32 lanes: fp32 as they are, fp16 through F16C, bf16 by a shift,
// int8 widened (its per-position scale is applied to the row's score and value weight, not per element).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const c10::BFloat16* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Lane p of the result is hsum(a[p]), the same bits: each sum is added in hsum's order (low half plus high
// half, then (0+2)+(1+3), then the two), eight of them at once in 21 shuffles and adds instead of 8 x 6.
inline __m256 hsum8(const __m256* a) {
  __m256 c[4];  // c[p] = [lo+hi of a[p] | lo+hi of a[p+4]]
  for (int p = 0; p < 4; ++p)
    c[p] = _mm256_add_ps(_mm256_permute2f128_ps(a[p], a[p + 4], 0x20), _mm256_permute2f128_ps(a[p], a[p + 4], 0x31));
  const __m256 d0 = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x44), _mm256_shuffle_ps(c[0], c[1], 0xEE));
  const __m256 d1 = _mm256_add_ps(_mm256_shuffle_ps(c[2], c[3], 0x44), _mm256_shuffle_ps(c[2], c[3], 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(d0, d1, 0x88), _mm256_shuffle_ps(d0, d1, 0xDD));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// One task: G query heads against keys [begin, end) of one KV head. Leaves, per query head, the
// chunk's max score, its sum of exp(score - max) and its unnormalised output (D floats).
// E: the cache's element type; ks, vs: int8's per-position scales (nullptr for the other types).
// Row by row: each score summed across lanes alone (hsum), G x D/8 output accumulators (spilled
// beyond AVX2's 16 registers). Serves every type and head_dim but int8 at D = 64 (attend_rows, below).
template <int G, typename E>
void attend_row_by_row(const float* const* q, const E* k, const E* v, const float* ks, const float* vs, int64_t D,
                  int64_t begin, int64_t end, float scale, float* scores, float* partial) {
  const int64_t n = end - begin, vecs = D / 8;
  __m256 qv[G][kMaxDim / 8];
  for (int g = 0; g < G; ++g)
    for (int64_t d = 0; d < vecs; ++d) qv[g][d] = _mm256_mul_ps(_mm256_loadu_ps(q[g] + 8 * d), _mm256_set1_ps(scale));
  float mx[G];
  for (int g = 0; g < G; ++g) mx[g] = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {  // scores: each key row read once for all G heads
    const E* kr = k + (begin + j) * D;
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t d = 0; d < vecs; ++d) {
      const __m256 kd = load8(kr + 8 * d);
      for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(qv[g][d], kd, acc[g]);
    }
    for (int g = 0; g < G; ++g) {
      float s = hsum(acc[g]);
      if constexpr (std::is_same_v<E, int8_t>) s *= ks[begin + j];
      scores[g * kChunk + j] = s;
      mx[g] = std::max(mx[g], s);
    }
  }
  float sum[G];
  for (int g = 0; g < G; ++g) {  // exp(score - max), in place, and its sum
    float* s = scores + g * kChunk;
    const __m256 m = _mm256_set1_ps(mx[g]);
    __m256 tot = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
      _mm256_storeu_ps(s + j, e);
      tot = _mm256_add_ps(tot, e);
    }
    float t = hsum(tot);
    for (; j < n; ++j) {
      s[j] = std::exp(s[j] - mx[g]);
      t += s[j];
    }
    sum[g] = t;
  }
  __m256 out[G][kMaxDim / 8];
  for (int g = 0; g < G; ++g)
    for (int64_t d = 0; d < vecs; ++d) out[g][d] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {  // weighted values: each value row read once for all G heads
    const E* vr = v + (begin + j) * D;
    __m256 w[G];
    for (int g = 0; g < G; ++g) {
      float wj = scores[g * kChunk + j];
      if constexpr (std::is_same_v<E, int8_t>) wj *= vs[begin + j];
      w[g] = _mm256_set1_ps(wj);
    }
    for (int64_t d = 0; d < vecs; ++d) {
      const __m256 vd = load8(vr + 8 * d);
      for (int g = 0; g < G; ++g) out[g][d] = _mm256_fmadd_ps(w[g], vd, out[g][d]);
    }
  }
  for (int g = 0; g < G; ++g) {
    float* p = partial + g * (D + 2);
    p[0] = mx[g];
    p[1] = sum[g];
    for (int64_t d = 0; d < vecs; ++d) _mm256_storeu_ps(p + 2 + 8 * d, out[g][d]);
  }
}

// NB vectors of the output (dims [8 d0, 8 (d0 + NB))) for all G heads over value rows [j0, j1): the G x NB
// accumulators stay in registers (at most 12 of AVX2's 16) while the rows stream past, and carry over
// from the previous block of rows through `partial` (unless first). w: the weights, G rows of kChunk.
// Each accumulator adds its rows in order, as a whole-row pass would.
template <int G, int NB, typename E>
inline void weigh_values(const E* v, const float* w, int64_t D, int64_t j0, int64_t j1, int64_t d0, bool first,
                         float* partial) {
  __m256 out[G][NB];
  for (int g = 0; g < G; ++g)
    for (int b = 0; b < NB; ++b)
      out[g][b] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(partial + g * (D + 2) + 2 + 8 * (d0 + b));
  for (int64_t j = j0; j < j1; ++j) {
    const E* vr = v + j * D + 8 * d0;
    __m256 wj[G];
    for (int g = 0; g < G; ++g) wj[g] = _mm256_broadcast_ss(w + g * kChunk + j);
    for (int b = 0; b < NB; ++b) {
      const __m256 vd = load8(vr + 8 * b);
      for (int g = 0; g < G; ++g) out[g][b] = _mm256_fmadd_ps(wj[g], vd, out[g][b]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int b = 0; b < NB; ++b) _mm256_storeu_ps(partial + g * (D + 2) + 2 + 8 * (d0 + b), out[g][b]);
}

// The same task as attend_row_by_row, the same bits, fewer instructions.
// Scores go 4 key rows at a time (each row read once for all G heads, 4G accumulators), their sums 8 at
// a time across lanes (hsum8); values go a few output vectors at a time (weigh_values), so no
// accumulator leaves a register. The arithmetic and its order per score and per output element are
// those of the plain per-row loop: the same bits, for every element type.
// V: D / 8 known when compiled (0: read from D), so the loops over a row unroll into registers.
template <int G, typename E, int V>
void attend_rows(const float* const* q, const E* k, const E* v, const float* ks, const float* vs, int64_t D_,
                 int64_t begin, int64_t end, float scale, float* scores, float* partial) {
  constexpr bool kInt8 = std::is_same_v<E, int8_t>;
  const int64_t D = V ? 8 * V : D_;
  const int64_t n = end - begin, vecs = D / 8;
  __m256 qv[G][kMaxDim / 8];
  for (int g = 0; g < G; ++g)
    for (int64_t d = 0; d < vecs; ++d) qv[g][d] = _mm256_mul_ps(_mm256_loadu_ps(q[g] + 8 * d), _mm256_set1_ps(scale));
  __m256 mxv[G];
  for (int g = 0; g < G; ++g) mxv[g] = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {  // scores of 8 rows
    __m256 acc[G][8];
    if (j + 24 <= n) {  // the rows 16 ahead, a line at a time (DRAM streams them no faster otherwise)
      const char* ahead = reinterpret_cast<const char*>(k + (begin + j + 16) * D);
      for (int64_t b = 0; b < 8 * D * static_cast<int64_t>(sizeof(E)); b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    for (int h = 0; h < 8; h += 4) {
      __m256 a[4][G];
      for (int p = 0; p < 4; ++p)
        for (int g = 0; g < G; ++g) a[p][g] = _mm256_setzero_ps();
      const E* kr = k + (begin + j + h) * D;
      for (int p = 0; p < 4; ++p) {  // row by row, in address order (the prefetchers follow it)
        for (int64_t d = 0; d < vecs; ++d) {
          const __m256 kd = load8(kr + p * D + 8 * d);
          for (int g = 0; g < G; ++g) a[p][g] = _mm256_fmadd_ps(qv[g][d], kd, a[p][g]);
        }
      }
      for (int p = 0; p < 4; ++p)
        for (int g = 0; g < G; ++g) acc[g][h + p] = a[p][g];
    }
    for (int g = 0; g < G; ++g) {
      __m256 s = hsum8(acc[g]);
      if constexpr (kInt8) s = _mm256_mul_ps(s, _mm256_loadu_ps(ks + begin + j));
      _mm256_storeu_ps(scores + g * kChunk + j, s);
      mxv[g] = _mm256_max_ps(mxv[g], s);
    }
  }
  float mx[G];
  for (int g = 0; g < G; ++g) mx[g] = hmax(mxv[g]);
  for (; j < n; ++j) {  // the last rows one at a time
    const E* kr = k + (begin + j) * D;
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t d = 0; d < vecs; ++d) {
      const __m256 kd = load8(kr + 8 * d);
      for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(qv[g][d], kd, acc[g]);
    }
    for (int g = 0; g < G; ++g) {
      float s = hsum(acc[g]);
      if constexpr (kInt8) s *= ks[begin + j];
      scores[g * kChunk + j] = s;
      mx[g] = std::max(mx[g], s);
    }
  }
  float sum[G];
  for (int g = 0; g < G; ++g) {  // exp(score - max), in place, and its sum; int8: times the value's scale
    float* s = scores + g * kChunk;
    const __m256 m = _mm256_set1_ps(mx[g]);
    __m256 tot = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
      tot = _mm256_add_ps(tot, e);
      _mm256_storeu_ps(s + i, kInt8 ? _mm256_mul_ps(e, _mm256_loadu_ps(vs + begin + i)) : e);
    }
    float t = hsum(tot);
    for (; i < n; ++i) {
      const float e = std::exp(s[i] - mx[g]);
      t += e;
      s[i] = kInt8 ? e * vs[begin + i] : e;
    }
    sum[g] = t;
  }
  // Values in blocks of kRows rows, L1-resident while each block's passes over the output vectors read it
  // (whole passes over the chunk would stream it from memory once per pass); rows prefetched a block ahead.
  constexpr int NB = G >= 12 ? 1 : 12 / G;  // output vectors per pass: G x NB accumulators
  constexpr int64_t kRows = 32;
  const E* vb = v + begin * D;
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(E));
  for (int64_t j0 = 0; j0 < n; j0 += kRows) {
    const int64_t j1 = std::min(n, j0 + kRows);
    const char* ahead = reinterpret_cast<const char*>(vb + j1 * D);
    for (int64_t b = 0; b < (std::min(n, j1 + kRows) - j1) * row_bytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    int64_t d0 = 0;
    for (; d0 + NB <= vecs; d0 += NB) weigh_values<G, NB, E>(vb, scores, D, j0, j1, d0, j0 == 0, partial);
    if constexpr (V == 0 || V % NB != 0)
      for (; d0 < vecs; ++d0) weigh_values<G, 1, E>(vb, scores, D, j0, j1, d0, j0 == 0, partial);
  }
  for (int g = 0; g < G; ++g) {
    partial[g * (D + 2)] = mx[g];
    partial[g * (D + 2) + 1] = sum[g];
  }
}

template <int G, typename E>
void attend_chunk(const float* const* q, const E* k, const E* v, const float* ks, const float* vs, int64_t D,
                  int64_t begin, int64_t end, float scale, float* scores, float* partial) {
  // int8 caches at D = 64 (SmolLM2's head_dim) go through attend_rows: the same bits, 1.2-1.4x faster at
  // ~1,400 positions. fp16, bf16 and fp32 rows stay row by row: streamed from memory (as in a step, where
  // the weights evict each layer's rows), they ran 0.85x (fp16, bf16) and 0.6x (fp32) as fast through
  // attend_rows, with or without its software prefetch; the cause is not found (no hardware counters here).
  // Measured with both builds in one process, alternating, a fresh copy of 30 layers' caches each round.
  if constexpr (std::is_same_v<E, int8_t>) {
    if (D == 64) return attend_rows<G, E, 8>(q, k, v, ks, vs, D, begin, end, scale, scores, partial);
  }
  attend_row_by_row<G, E>(q, k, v, ks, vs, D, begin, end, scale, scores, partial);
}

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
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(G * kChunk);
    for (int64_t t = t0; t < t1; ++t) {
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
        attend_chunk<decltype(g)::value, E>(qs, k, v, ks, vs, D, tk.begin, tk.end, static_cast<float>(scale),
                                            scores.data(), partials.data() + t * stride);
      });
    }
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
