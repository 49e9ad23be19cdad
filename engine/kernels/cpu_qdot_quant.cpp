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
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sum.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

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

struct Product {  // a * b, each with its own row stride
  const float *a, *b;
  int64_t sa, sb;
  void block(int64_t m, int64_t k, __m256* v) const {
    for (int j = 0; j < 4; ++j)
      v[j] = rounded(_mm256_mul_ps(_mm256_loadu_ps(a + m * sa + k + 8 * j), _mm256_loadu_ps(b + m * sb + k + 8 * j)));
  }
};

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
  // torch's rms_norm in fp32: mean(x^2) as sum / K (its own sum: the summation order is torch's), then
  // rsqrt(mean + float(eps)) = 1 / sqrt(...), exactly (tests/test_cpu_fused.py holds it to the bits); the
  // _out forms where the caller keeps their buffers (the same kernels, the same bits)
  at::Tensor ss;
  if (s && s->squares.defined() && s->sums.defined()) {
    at::Tensor squares = s->squares;
    const int64_t row = 1;
    ss = s->sums;
    at::sum_out(ss, at::mul_out(squares, x, x), at::IntArrayRef(row));
  } else {
    ss = at::sum(at::mul(x, x), {1});
  }
  std::vector<float> r(M);
  const float* sp = ss.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) r[m] = 1.f / std::sqrt(sp[m] / static_cast<float>(K) + static_cast<float>(eps));
  Quantized q = allocate(x, M, K, true, s);
  quantize_rows(Normed{x.data_ptr<float>(), r.data(), weight.data_ptr<float>(), x.stride(0)}, M, q.L, q);
  return q;
}

Quantized quantize_product(const at::Tensor& a, const at::Tensor& b, const Scratch* s) {
  check_rows(a, "a");
  check_rows(b, "b");
  TORCH_CHECK(a.sizes() == b.sizes(), "a and b: the same shape");
  Quantized q = allocate(a, a.size(0), a.size(1), true, s);
  quantize_rows(Product{a.data_ptr<float>(), b.data_ptr<float>(), a.stride(0), b.stride(0)}, a.size(0), q.L, q);
  return q;
}

}  // namespace qdot
