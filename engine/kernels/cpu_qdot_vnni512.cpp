// The AVX-512 VNNI forms of the integer row kernels (cpu_qdot.h), vpdpbusd (EVEX) on
//   vnni512: 512-bit vectors: int8, two steps of a chunk a load, the two 256-bit halves added once a
//            chunk (a last, partial chunk takes the 256-bit steps); 4-bit, a group's 16 channels a vector;
//   vnni256: the same instruction on 256-bit vectors (AVX-512 VL), as the AVX-VNNI form.
// Their integer sums are those of every other form. Zen 4 runs a 512-bit op as two 256-bit halves,
// Intel's AVX-512 cores natively: `python -m engine.bench gemv` times both forms on the CPU at hand
// (engine/kernels/cpu_qdot.py ISAS says which is preferred, and why). The whole file is compiled for
// these ISAs (the pragma); nothing in it is reachable except through the dispatch in cpu_qdot.cpp,
// which checks cpuid first.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#include <immintrin.h>

#include "cpu_qdot.h"

namespace qdot::vnni256 {
namespace {
constexpr bool kBias8 = true;  // int8 weights offset to unsigned (w + 128: the sign bit flipped)
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i dot8(__m256i acc, __m256i w, __m256i s) {
  return _mm256_dpbusd_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))), s);
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::vnni256

#define QDOT_OWN_CHUNKS
#define QDOT_OWN_GROUPS
#define QDOT_LANES512
namespace qdot::vnni512 {
namespace {
constexpr bool kBias8 = true;
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i dot8(__m256i acc, __m256i w, __m256i s) {
  return _mm256_dpbusd_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))), s);
}
inline __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i halves_sum(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }

// A group's 16 channels in one 512-bit vector (cpu_qdot_body.inc's F16 and I16 on two 256-bit halves).
struct I16 { __m512i v; };
struct F16 { __m512 v; };
inline F16 f16_zero() { return {_mm512_setzero_ps()}; }
inline F16 f16_halves(const uint8_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline F16 f16_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void f16_store(float* p, F16 v) { _mm512_storeu_ps(p, v.v); }
inline F16 f16_add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 f16_scaled(F16 acc, I16 d, F16 s, float x) {
  return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(d.v), _mm512_mul_ps(s.v, _mm512_set1_ps(x)), acc.v)};
}
inline F16 f16_fma(F16 acc, F16 o, float x) { return {_mm512_fmadd_ps(o.v, _mm512_set1_ps(x), acc.v)}; }

template <int M>
inline void int4_dots(const uint8_t* w, const int8_t* const* x, int64_t step, I16* d) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i a0[M], a1[M];
  for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j) {  // piece j: steps j (low nibbles) and j + 4 (high)
    const __m512i b = ld512(w + 64 * j);
    const __m512i lo = _mm512_and_si512(b, low), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
    for (int m = 0; m < M; ++m) {
      a0[m] = _mm512_dpbusd_epi32(a0[m], lo, _mm512_set1_epi32(dword(x[m] + 4 * step * j)));
      a1[m] = _mm512_dpbusd_epi32(a1[m], hi, _mm512_set1_epi32(dword(x[m] + 4 * step * (j + 4))));
    }
  }
  for (int m = 0; m < M; ++m) d[m].v = _mm512_add_epi32(a0[m], a1[m]);
}

template <int M>
inline void int8_chunk(const int8_t* w, const int8_t* x, int64_t kp, __m256i* d) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i a0[M], a1[M];
  for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm512_setzero_si512();
  for (int s = 0; s < 8; s += 4) {  // steps s, s + 1 and s + 2, s + 3
    const __m512i u0 = _mm512_xor_si512(ld512(w + 32 * s), flip), u1 = _mm512_xor_si512(ld512(w + 32 * (s + 2)), flip);
    for (int m = 0; m < M; ++m) {
      a0[m] = _mm512_dpbusd_epi32(a0[m], u0, ld512(x + m * kp + 32 * s));
      a1[m] = _mm512_dpbusd_epi32(a1[m], u1, ld512(x + m * kp + 32 * (s + 2)));
    }
  }
  for (int m = 0; m < M; ++m) d[m] = halves_sum(_mm512_add_epi32(a0[m], a1[m]));
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::vnni512
#undef QDOT_OWN_CHUNKS
#undef QDOT_OWN_GROUPS
#undef QDOT_LANES512
