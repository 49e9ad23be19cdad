// The AVX-VNNI form of the integer row kernels (cpu_qdot.h): the VEX-encoded vpdpbusd of Intel's
// Alder Lake and later client cores (and Zen 5), which lack AVX-512: 256-bit vectors throughout.
// Only reached through cpu_qdot.cpp's dispatch, after cpuid says AVX-VNNI.
#pragma GCC target("avx2,fma,f16c,avxvnni")
#include <immintrin.h>

#include "cpu_qdot.h"

namespace qdot::avxvnni {
namespace {
constexpr bool kBias8 = true;  // int8 weights offset to unsigned (w + 128: the sign bit flipped)
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
inline __m256i dot8(__m256i acc, __m256i w, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))), s);
}
}  // namespace
#include "cpu_qdot_body.inc"
}  // namespace qdot::avxvnni
