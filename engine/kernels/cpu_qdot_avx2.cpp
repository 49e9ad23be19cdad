// The AVX2 form of the integer row kernels (cpu_qdot.h): vpmaddubsw multiplies the unsigned by the
// signed bytes into int16 pairs (at most 2 x 255 x 127 for the 4-bit weights, 2 x 127 x 127 with the
// int8 sign trick: no saturation), vpmaddwd by ones sums the pairs into int32.
#include <immintrin.h>

#include "cpu_qdot.h"

namespace qdot::avx2 {
namespace {
inline __m256i dot(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// Two 32-byte products into one int32 vector: each int16 sum stays within 2 x 2 x 15 x 127 (4-bit weights).
inline __m256i dot2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
                           _mm256_set1_epi16(1));
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::avx2
