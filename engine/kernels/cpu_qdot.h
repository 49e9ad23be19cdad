// Integer dot-product kernels: int8 / 4-bit weights times int8 activations quantized per block of 32.
//
// The per-ISA row kernels (cpu_qdot_avx2.cpp, cpu_qdot_vnni512.cpp, cpu_qdot_avxvnni.cpp) share one
// body (cpu_qdot_body.inc) and differ only in the instruction that multiplies 32 unsigned bytes by
// 32 signed bytes into 8 int32 sums: vpmaddubsw + vpmaddwd (AVX2), vpdpbusd (AVX-512 VNNI, EVEX on
// 256 bits; AVX-VNNI, VEX). Each int32 lane sums the same 4 products in every form, so the forms give
// the same bits. This header is plain C++ (no torch): the ISA files include nothing compiled with
// their wider flags that another file could link to.
#pragma once
#include <cstdint>

namespace qdot {

constexpr int64_t kBlock = 32;      // activations and 4-bit weights: one scale per 32 inputs
constexpr int kMaxRows = 4;         // rows per kernel pass: their accumulators fit 16 ymm registers
constexpr int64_t kMaxGroups = 512;  // K up to 16,384 (a row block's scales, 32 KB, live on the stack)

struct Args {
  const int8_t* xq;     // [M, K] activations quantized to int8 (-127..127)
  const float* xs;      // [M, G] their scale per block of 32
  const float* xsum;    // [M, G] the exact fp32 sum of each block of x (4-bit weights' offset term)
  int64_t K, N;         // inputs, outputs
  const void* w;        // int8 [N, K] (signed), or 4-bit [N, K / 2] (cpu_gemm.py pack_int4's layout)
  const float* scale8;  // int8: [N] fp32, one scale per output channel
  const uint16_t* scale4;   // 4-bit: [N, G] fp16 scale
  const uint16_t* offset4;  // 4-bit: [N, G] fp16 offset (w = q * scale + offset, q in 0..15)
  float* y;             // [M, N]
};

// Rows [m0, m0 + rows) (rows <= kMaxRows) of y for output channels [n0, n1).
using RowsFn = void (*)(const Args&, int64_t m0, int rows, int64_t n0, int64_t n1);

namespace avx2 { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }
namespace vnni512 { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }
namespace avxvnni { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }

}  // namespace qdot
