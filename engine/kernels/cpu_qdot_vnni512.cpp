// The AVX-512 VNNI forms of the integer row kernels (cpu_qdot.h), vpdpbusd (EVEX) on
//   vnni512: 512-bit vectors, a group's 16 channels a vector;
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

#define QDOT_OWN_DOTS4
#define QDOT_OWN_DOTS8
#define QDOT_LANES512
namespace qdot::vnni512 {
namespace {
constexpr bool kBias8 = true;
inline __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }

// A group's 16 channels in one 512-bit vector (cpu_qdot_body.inc's F16 and I16 on two 256-bit halves).
struct I16 { __m512i v; };
struct F16 { __m512 v; };
inline F16 f16_zero() { return {_mm512_setzero_ps()}; }
inline F16 f16_halves(const uint8_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline F16 f16_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void f16_store(float* p, F16 v) { _mm512_storeu_ps(p, v.v); }
inline F16 f16_add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 f16_mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 f16_scaled(F16 acc, I16 d, F16 s, float x) {
  return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(d.v), _mm512_mul_ps(s.v, _mm512_set1_ps(x)), acc.v)};
}
inline F16 f16_fma(F16 acc, F16 o, float x) { return {_mm512_fmadd_ps(o.v, _mm512_set1_ps(x), acc.v)}; }
inline F16 f16_dot(F16 acc, I16 d, int32_t less, float x) {
  return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d.v, _mm512_set1_epi32(less))), _mm512_set1_ps(x), acc.v)};
}

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
inline void int8_dots(const int8_t* w, const int8_t* const* x, int64_t step, I16* d) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));  // w + 128: unsigned bytes (xqs takes it back)
  __m512i a0[M], a1[M];
  for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm512_setzero_si512();
  for (int s = 0; s < 8; s += 2) {
    const __m512i u0 = _mm512_xor_si512(ld512(w + 64 * s), flip), u1 = _mm512_xor_si512(ld512(w + 64 * (s + 1)), flip);
    for (int m = 0; m < M; ++m) {
      a0[m] = _mm512_dpbusd_epi32(a0[m], u0, _mm512_set1_epi32(dword(x[m] + 4 * step * s)));
      a1[m] = _mm512_dpbusd_epi32(a1[m], u1, _mm512_set1_epi32(dword(x[m] + 4 * step * (s + 1))));
    }
  }
  for (int m = 0; m < M; ++m) d[m].v = _mm512_add_epi32(a0[m], a1[m]);
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::vnni512
#undef QDOT_OWN_DOTS4
#undef QDOT_OWN_DOTS8
#undef QDOT_LANES512
