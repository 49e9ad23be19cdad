// The integer kernels' activation quantizer (cpu_qdot_ops.h): rows of fp32 values -> int8 per block of
// 32, in the kernels' interleaved layout (cpu_qdot.h) or in block order. The values come from x
// itself, or are made on the way from what a decoder layer has in hand (rms_norm(x) * weight, or
// silu(gate) * up), so that the fused projections (cpu_fused.cpp) need not write them out and read
// them back: the same floats, the same bits.
//
// A block: s = max|v| / 127, q = round-half-even(v * (1 / s)) (0 where the block is all zeros), its
// fp32 sum (4 vectors of 8, (v0 + v1) + (v2 + v3), then across lanes) and 128 x the sum of its q.
// engine/kernels/cpu_qdot.py `quantize_reference` is the same arithmetic in torch (tested bit for bit:
// q and s; the sum up to its order).
#include <ATen/Parallel.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/silu.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <torch/library.h>

#include "cpu_qdot_ops.h"

namespace qdot {
namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A value made on the way is rounded to fp32 as torch's own op would leave it in memory: the empty asm
// keeps the compiler from fusing its last multiply into a later add (an FMA would skip that rounding).
inline __m256 rounded(__m256 v) {
  asm("" : "+x"(v));
  return v;
}

struct Plain {  // x [M, K], rows `stride` apart
  const float* x;
  int64_t stride;
  void block(int64_t m, int64_t k, __m256* v) const {
    for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + m * stride + k + 8 * j);
  }
};

struct Normed {  // (x * r[m]) * w: torch's rms_norm in fp32, two roundings
  const float *x, *r, *w;
  int64_t stride;
  void block(int64_t m, int64_t k, __m256* v) const {
    const __m256 rm = _mm256_set1_ps(r[m]);
    for (int j = 0; j < 4; ++j)
      v[j] = rounded(_mm256_mul_ps(rounded(_mm256_mul_ps(_mm256_loadu_ps(x + m * stride + k + 8 * j), rm)),
                                   _mm256_loadu_ps(w + k + 8 * j)));
  }
};

// torch's silu in fp32, x / (1 + exp(-x)), lane by lane as its vectorized kernel computes it (exp: SLEEF's
// expf_u10, which torch's Vectorized<float>::exp calls at every width: a rounded power of two times a
// polynomial, each step one rounding or one FMA), so that the down projection's input is made on the way
// (silu(gate) * up, quantized) without at::silu's call, whose set-up cost a one-row step more than its
// arithmetic, on the leading thread alone (docs/streams-2026-12-06.md: the timings, and how). Taken only where
// a probe against at::silu finds the same bits (silu_matches); else at::silu serves.
inline __m256 silu8(__m256 x) {
  const __m256 d = _mm256_xor_ps(x, _mm256_set1_ps(-0.f));  // -x
  const __m256i q = _mm256_cvtps_epi32(rounded(_mm256_mul_ps(d, _mm256_set1_ps(1.442695040888963407359924681001892137426645954152985934135449406931f))));
  const __m256 qf = _mm256_cvtepi32_ps(q);
  __m256 s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-0.693145751953125f), d);
  s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-1.428606765330187045e-06f), s);
  __m256 u = _mm256_set1_ps(0.000198527617612853646278381f);
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00139304355252534151077271f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.00833336077630519866943359f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.0416664853692054748535156f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.166666671633720397949219f));
  u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(0.5f));
  u = rounded(_mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(rounded(_mm256_mul_ps(s, s)), u, s)));
  const __m256i h = _mm256_srai_epi32(q, 1);  // u * 2^q as two powers of two (q may exceed one exponent's range)
  const auto pow2 = [](__m256i e) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(0x7f)), 23)); };
  u = rounded(_mm256_mul_ps(rounded(_mm256_mul_ps(u, pow2(h))), pow2(_mm256_sub_epi32(q, h))));
  u = _mm256_andnot_ps(_mm256_cmp_ps(d, _mm256_set1_ps(-104.f), _CMP_LT_OQ), u);
  u = _mm256_blendv_ps(u, _mm256_set1_ps(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(_mm256_set1_ps(100.f), d, _CMP_LT_OQ));
  return _mm256_div_ps(x, rounded(_mm256_add_ps(_mm256_set1_ps(1.0f), u)));
}

template <bool Silu>
struct Product {  // a * b, or silu(a) * b (torch's silu, then the product, each rounded), each with its own row stride
  const float *a, *b;
  int64_t sa, sb;
  void block(int64_t m, int64_t k, __m256* v) const {
    for (int j = 0; j < 4; ++j) {
      const __m256 x = _mm256_loadu_ps(a + m * sa + k + 8 * j);
      v[j] = rounded(_mm256_mul_ps(Silu ? rounded(silu8(x)) : x, _mm256_loadu_ps(b + m * sb + k + 8 * j)));
    }
  }
};

// Whether silu8 gives at::silu's bits in this process (another torch, or another exp, would not): checked once
// on values across silu's whole range (both tails, around 0, the exp's cut-offs, subnormals).
bool probe_silu() {
  std::vector<float> x;
  uint32_t seed = 2463534242u;
  for (int i = 0; i < 1 << 16; ++i) {
    seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
    const float unit = static_cast<float>(seed >> 8) / 16777216.f;  // [0, 1)
    x.push_back(i % 2 ? (unit - 0.5f) * 240.f : std::ldexp(unit - 0.5f, (i % 40) - 30));
  }
  for (float v : {0.f, -0.f, 1e-38f, -1e-38f, 87.f, -87.f, 88.8f, -88.8f, 103.9f, -103.9f, 104.1f, -104.1f, 100.f,
                  -100.f, 1e30f, -1e30f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  while (x.size() % 8) x.push_back(0.f);
  const at::Tensor want = at::silu(at::from_blob(x.data(), {static_cast<int64_t>(x.size())}));
  const float* w = want.data_ptr<float>();
  for (size_t i = 0; i < x.size(); i += 8) {
    alignas(32) float got[8];
    _mm256_store_ps(got, silu8(_mm256_loadu_ps(x.data() + i)));
    if (std::memcmp(got, w + i, sizeof(got)) != 0) return false;
  }
  return true;
}

// torch's sum of a contiguous fp32 row, in its own order (at::sum's CPU kernel, SumKernel.cpp:
// vectorized_inner_sum over row_sum over multi_row_sum): `lanes`-wide vectors summed 4 at a time into 4
// accumulators, cascaded every 16 (or more) rows of 4 vectors, the leftover vectors into the first, the 4
// summed in order, then the scalars past the last whole vector, then the lanes, in order; the output
// starts at 0. Why not at::sum itself: for a decode step's one row its reduction set-up costs ~3 us a
// call, 61 calls a step (the norms before every q/k/v and gate/up product, and the head's), ~5% of an
// int4w8a+head8 step at context 256 (2 threads, AMD EPYC Zen 4). Each torch vector is V registers of 8
// lanes (lanes = 8V), added lane by lane as torch's are: the same additions in the same order, in vector
// registers rather than scalar loops, which took longer (docs/streams-2026-12-06.md: the timings, and how).
template <int V>
float torch_row_sum(const float* x, int64_t K) {
  constexpr int kLevels = 4, kIlp = 4, lanes = 8 * V;
  const int64_t vecs = K / lanes, n = vecs / kIlp;
  int64_t ceil_log2 = 1;
  if (n > 2) ceil_log2 = 64 - __builtin_clzll(static_cast<uint64_t>(n - 1));
  const int64_t power = std::max<int64_t>(4, ceil_log2 / kLevels), step = int64_t{1} << power, mask = step - 1;
  __m256 acc[kLevels][kIlp][V];
  for (auto& level : acc)
    for (auto& a : level)
      for (__m256& v : a) v = _mm256_setzero_ps();
  auto add = [&](__m256* a, const __m256* b) __attribute__((always_inline)) {
    for (int v = 0; v < V; ++v) a[v] = _mm256_add_ps(a[v], b[v]);
  };
  auto load = [&](int64_t vec, __m256* out) __attribute__((always_inline)) {  // torch's vector `vec`
    for (int v = 0; v < V; ++v) out[v] = _mm256_loadu_ps(x + vec * lanes + 8 * v);
  };
  auto row = [&](int64_t i) __attribute__((always_inline)) {  // "row" i: vectors 4i .. 4i + 3
    for (int k = 0; k < kIlp; ++k) {
      __m256 b[V];
      load(kIlp * i + k, b);
      add(acc[0][k], b);
    }
  };
  int64_t i = 0;
  while (i + step <= n) {
    for (int64_t j = 0; j < step; ++j, ++i) row(i);
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kIlp; ++k) {
        add(acc[j][k], acc[j - 1][k]);
        for (__m256& v : acc[j - 1][k]) v = _mm256_setzero_ps();
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < n; ++i) row(i);
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < kIlp; ++k) add(acc[0][k], acc[j][k]);
  for (int64_t v = kIlp * n; v < vecs; ++v) {
    __m256 b[V];
    load(v, b);
    add(acc[0][0], b);
  }
  for (int k = 1; k < kIlp; ++k) add(acc[0][0], acc[0][k]);
  float total = 0.f;
  for (int64_t k = vecs * lanes; k < K; ++k) total += x[k];
  alignas(32) float l[lanes];
  for (int v = 0; v < V; ++v) _mm256_store_ps(l + 8 * v, acc[0][0][v]);
  for (int k = 0; k < lanes; ++k) total += l[k];
  return 0.f + total;
}

float torch_row_sum(const float* x, int64_t K, int lanes) {
  return lanes == 8 ? torch_row_sum<1>(x, K) : torch_row_sum<2>(x, K);
}

// The vector width at which torch_row_sum gives at::sum's bits in this process (its kernel's width is
// not the CPU's: torch 2.13 sums with 8 lanes where it dispatches AVX-512), found once by summing
// probe rows both ways; 0 where neither width matches (another torch): then at::sum itself serves.
int probe_lanes() {
  uint32_t seed = 12345;
  std::vector<float> row(4136);
  for (int lanes : {8, 16}) {
    bool same = true;
    for (int64_t K : {576, 1000, 4136}) {
      for (int64_t k = 0; k < K; ++k) {  // squares of a wide range, as a norm sums
        seed = seed * 1664525u + 1013904223u;
        const float v = (static_cast<float>(seed >> 8) / 16777216.f - 0.5f) * std::exp2(static_cast<float>(k % 23) - 11.f);
        row[k] = v * v;
      }
      const float want = at::sum(at::from_blob(row.data(), {K}), 0).item<float>();
      same = same && torch_row_sum(row.data(), K, lanes) == want;
    }
    if (same) return lanes;
  }
  return 0;
}

int sum_lanes() {
  static const int lanes = probe_lanes();
  return lanes;
}

template <typename Src>
void quantize_rows(const Src& src, int64_t M, const Layout& L, const Quantized& q) {
  const int64_t G = L.G, C = G / kChunk, T = G % kChunk;
  int8_t* xq = q.xq();
  float *xs = q.xs(), *xsum = q.xsum();
  int32_t* xqs = q.xqs();
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t m = r0; m < r1; ++m) {
      int8_t* qr = xq + m * L.kp;
      if (L.interleaved) {  // the padding: a partial last chunk's missing lanes, the scales past G
        if (T) std::memset(qr + C * 256, 0, 256);
        for (int64_t g = G; g < L.gp; ++g) xs[m * L.gp + g] = xsum[m * L.gp + g] = 0.f, xqs[m * L.gp + g] = 0;
      }
      for (int64_t g = 0; g < G; ++g) {
        __m256 v[4];
        src.block(m, g * kBlock, v);
        const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                               _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask))));
        const float s = amax / 127.f, inv = s > 0.f ? 1.f / s : 0.f;
        const __m256 iv = _mm256_set1_ps(inv);
        __m256i qi[4];
        for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], iv));  // round half to even
        const __m256i qsum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
        const __m256i bytes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])), order);
        alignas(32) int32_t words[8], qs[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(words), bytes);
        _mm256_store_si256(reinterpret_cast<__m256i*>(qs), qsum);
        const int64_t at = m * L.gp + g;
        xs[at] = s;
        xsum[at] = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
        xqs[at] = 128 * (qs[0] + qs[1] + qs[2] + qs[3] + qs[4] + qs[5] + qs[6] + qs[7]);
        if (!L.interleaved) {
          std::memcpy(qr + g * kBlock, words, kBlock);
          continue;
        }
        const int64_t c = g / kChunk, i = g % kChunk, lanes = c < C ? kChunk : T;
        for (int j = 0; j < 8; ++j) std::memcpy(qr + c * 256 + 4 * (lanes * j + i), words + j, 4);  // step j, lane i
      }
    }
  });
}

Quantized allocate(const at::Tensor& like, int64_t M, int64_t K, bool interleaved, const Scratch* s) {
  TORCH_CHECK(M >= 1 && K % kBlock == 0, "K must be a multiple of ", kBlock, ", got ", K);
  const Layout L(K, interleaved);
  if (s && s->bytes.defined()) {  // the caller's buffer: no allocation
    TORCH_CHECK(s->bytes.scalar_type() == at::kByte && s->bytes.is_contiguous() &&
                    s->bytes.numel() >= M * Quantized::bytes(L),
                "scratch bytes: contiguous uint8, at least ", M * Quantized::bytes(L));
    return Quantized{s->bytes, L, M};
  }
  return Quantized{at::empty({M * Quantized::bytes(L)}, like.options().dtype(at::kByte)), L, M};
}

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.stride(1) == 1 && t.device().is_cpu(),
              what, " must be fp32 CPU rows [M, K], each contiguous");
}

}  // namespace

bool silu_matches() {
  static const bool same = probe_silu();
  return same;
}

Quantized quantize(const at::Tensor& x, bool interleaved, const Scratch* s) {
  check_rows(x, "x");
  Quantized q = allocate(x, x.size(0), x.size(1), interleaved, s);
  quantize_rows(Plain{x.data_ptr<float>(), x.stride(0)}, x.size(0), q.L, q);
  return q;
}

Quantized quantize_normed(const at::Tensor& x, const at::Tensor& weight, double eps, const Scratch* s) {
  check_rows(x, "x");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == K && weight.scalar_type() == at::kFloat, "norm weight: fp32 [K]");
  // torch's rms_norm in fp32: mean(x^2) as sum / K (the sum in torch's order: torch_row_sum), then
  // rsqrt(mean + float(eps)) = 1 / sqrt(...), exactly (tests/test_cpu_fused.py holds it to the bits);
  // x * x into the caller's buffer where it keeps one
  Quantized q = allocate(x, M, K, true, s);  // first: it checks K (a multiple of the 32-wide blocks)
  at::Tensor squares = s && s->squares.defined() ? s->squares : at::empty({M, K}, x.options());
  TORCH_CHECK(squares.is_contiguous() && squares.numel() >= M * K, "scratch squares: contiguous, at least M x K");
  float* sq = squares.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const int lanes = sum_lanes();
  std::vector<float> r(M);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = xp + m * x.stride(0);
    for (int64_t k = 0; k < K; k += 8) {
      const __m256 v = _mm256_loadu_ps(row + k);
      _mm256_storeu_ps(sq + m * K + k, rounded(_mm256_mul_ps(v, v)));
    }
    const float sum = lanes ? torch_row_sum(sq + m * K, K, lanes)
                            : at::sum(at::from_blob(sq + m * K, {K}), 0).item<float>();
    r[m] = 1.f / std::sqrt(sum / static_cast<float>(K) + static_cast<float>(eps));
  }
  quantize_rows(Normed{x.data_ptr<float>(), r.data(), weight.data_ptr<float>(), x.stride(0)}, M, q.L, q);
  return q;
}

namespace {
template <bool Silu>  // quantize_product's rows, and quantize_gated's where silu8 gives torch's bits
Quantized product_rows(const at::Tensor& a, const at::Tensor& b, const Scratch* s) {
  check_rows(a, "a");
  check_rows(b, "b");
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b: the same shape");
  Quantized q = allocate(a, a.size(0), a.size(1), true, s);
  quantize_rows(Product<Silu>{a.data_ptr<float>(), b.data_ptr<float>(), a.stride(0), b.stride(0)}, a.size(0), q.L, q);
  return q;
}
}  // namespace

Quantized quantize_product(const at::Tensor& a, const at::Tensor& b, const Scratch* s) {
  return product_rows<false>(a, b, s);
}

Quantized quantize_gated(const at::Tensor& gate, const at::Tensor& up, const Scratch* s) {
  if (silu_matches()) return product_rows<true>(gate, up, s);
  at::Tensor out = s && s->gated.defined() ? s->gated : at::empty_like(gate);  // torch's own silu, in the caller's buffer
  return quantize_product(at::silu_out(out, gate), up, s);
}

int64_t sum_lanes_op() { return sum_lanes(); }

}  // namespace qdot

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("qdot_sum_lanes() -> int", &qdot::sum_lanes_op);  // the tests: which way the norms sum here
  m.def("qdot_silu_matches() -> bool", &qdot::silu_matches);  // the tests: whether silu is made on the way
}
