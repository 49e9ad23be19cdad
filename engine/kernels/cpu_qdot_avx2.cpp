// The AVX2 form of the integer row kernels (cpu_qdot.h): vpmaddubsw multiplies the unsigned by the
// signed bytes into int16 pairs, vpmaddwd by ones sums the pairs into int32.
#include <immintrin.h>

#include "cpu_qdot.h"

#define QDOT_OWN_DOTS4

namespace qdot::avx2 {
namespace {
constexpr bool kBias8 = false;  // int8 weights: |w| . (x with w's sign)
inline __m256i widen(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_add_epi32(acc, widen(_mm256_maddubs_epi16(u, s))); }
inline __m256i dot8(__m256i acc, __m256i w, __m256i s) {  // a pair is up to 2 x 127 x 127: widened at once
  return _mm256_add_epi32(acc, widen(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w))));
}
inline __m256i load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 4-bit: a block's 8 steps summed in int16 (a vpmaddubsw pair is at most 2 x 15 x 127, 8 of them
// 30,480: no saturation), widened to int32 once a block.
// D: cpu_qdot_body.inc's I16 (two 256-bit halves), declared after this file's own pieces.
template <int M, typename D>
inline void int4_dots(const uint8_t* w, const int8_t* const* x, int64_t step, D* d) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < 2; ++h) {
      const __m256i b = load(w + 64 * j + 32 * h);
      const __m256i lo = _mm256_and_si256(b, low), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
      for (int m = 0; m < M; ++m)
        acc[m][h] = _mm256_add_epi16(acc[m][h], _mm256_add_epi16(
            _mm256_maddubs_epi16(lo, _mm256_set1_epi32(dword(x[m] + 4 * step * j))),
            _mm256_maddubs_epi16(hi, _mm256_set1_epi32(dword(x[m] + 4 * step * (j + 4))))));
    }
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < 2; ++h) d[m].h[h] = widen(acc[m][h]);
}

}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::avx2
