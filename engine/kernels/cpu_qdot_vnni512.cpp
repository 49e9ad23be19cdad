// The AVX-512 VNNI forms of the integer row kernels (cpu_qdot.h), vpdpbusd (EVEX) on
//   vnni512: 512-bit vectors, two steps of a chunk a load, the two 256-bit halves added once a chunk
//            (a last, partial chunk takes the 256-bit steps);
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
namespace qdot::vnni512 {
namespace {
constexpr bool kBias8 = true;
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i dot8(__m256i acc, __m256i w, __m256i s) {
  return _mm256_dpbusd_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))), s);
}
inline __m512i ld512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i halves_sum(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }

template <int M>
inline void int4_chunk(const uint8_t* w, const int8_t* x, int64_t kp, __m256i* d) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i a0[M], a1[M];
  for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm512_setzero_si512();
  for (int p = 0; p < 4; p += 2) {  // pieces p, p + 1: steps p, p + 1 (low nibbles) and p + 4, p + 5 (high)
    const __m512i b = ld512(w + 32 * p);
    const __m512i lo = _mm512_and_si512(b, low), hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
    for (int m = 0; m < M; ++m) {
      a0[m] = _mm512_dpbusd_epi32(a0[m], lo, ld512(x + m * kp + 32 * p));
      a1[m] = _mm512_dpbusd_epi32(a1[m], hi, ld512(x + m * kp + 32 * (p + 4)));
    }
  }
  for (int m = 0; m < M; ++m) d[m] = halves_sum(_mm512_add_epi32(a0[m], a1[m]));
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
