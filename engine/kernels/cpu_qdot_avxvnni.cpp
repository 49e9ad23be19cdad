// The AVX-VNNI form of the integer row kernels (cpu_qdot.h): the VEX-encoded vpdpbusd of Intel's
// Alder Lake and later client cores (and Zen 5), which lack AVX-512. Same arithmetic as the AVX-512
// VNNI form. Only reached through cpu_qdot.cpp's dispatch, after cpuid says AVX-VNNI.
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include <immintrin.h>

#include "cpu_qdot.h"

namespace qdot::avxvnni {
namespace {
inline __m256i dot(__m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i dot2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::avxvnni
