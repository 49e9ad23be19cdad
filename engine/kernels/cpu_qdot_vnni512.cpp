// The AVX-512 VNNI form of the integer row kernels (cpu_qdot.h): vpdpbusd (EVEX, on 256-bit vectors
// with AVX-512 VL) multiplies and sums 4 byte pairs into each int32 lane in one instruction. 256 bits
// rather than 512: the kernels read a 32-input block at a time, and Zen 4 runs a 512-bit op as two
// 256-bit halves anyway. The whole file is compiled for these ISAs (the pragma); nothing in it is
// reachable except through the dispatch in cpu_qdot.cpp, which checks cpuid first.
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#include <immintrin.h>

#include "cpu_qdot.h"

namespace qdot::vnni512 {
namespace {
inline __m256i dot(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i dot2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::vnni512
