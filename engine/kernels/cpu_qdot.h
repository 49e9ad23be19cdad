// Integer dot-product kernels: int8 / 4-bit weights times int8 activations quantized per block of 32.
//
// The per-ISA row kernels (cpu_qdot_avx2.cpp, cpu_qdot_vnni512.cpp, cpu_qdot_avxvnni.cpp) share one
// body (cpu_qdot_body.inc) and differ only in how they multiply 32 unsigned bytes by 32 signed bytes
// into 8 int32 sums: vpmaddubsw + vpmaddwd (AVX2), vpdpbusd (AVX-512 VNNI on 512 or 256-bit vectors, AVX-VNNI
// on 256); the AMX form (cpu_qdot_amx.cpp) takes each 16 rows of a product through tiles and the rest
// through the 512-bit rows. Every integer sum is exact and every float operation is the same sequence
// in every form, so the forms give the same bits. This header is plain C++ (no torch): the ISA files include nothing
// compiled with their wider flags that another file could link to.
//
// The int8 weights' interleaved layout (engine/kernels/cpu_qdot.py `interleave`), of the weights (their
// own, per output channel) and of the quantized activations (the kernels' scratch, per row) alike: a
// row is cut into chunks of 8 blocks of 32 inputs; in a chunk, 32-byte step s holds bytes 4s..4s+3 of
// block i in its int32 lane i. So one multiply-accumulate per step builds, in lane i, block i's whole
// integer dot product: no reduction across lanes, and the 8 blocks' scales apply in one vector FMA. A
// last chunk of T < 8 blocks keeps T lanes a step (4T-byte steps, dword T * s + i), the activations'
// tail too (zero past its 8T dwords). int8 weights: one byte a weight, 256 bytes a chunk.
//
// 4-bit weights: groups of kLanes4 = 16 output channels side by side, a channel a 32-bit lane (as the fp32
// panels of cpu_gemm.cpp), block after block: per block a kGroup4-byte record, 4 pieces of 64 bytes (piece
// j: each channel's 4 bytes of weights 4j..4j+3 in the low nibbles, 16+4j..16+4j+3 in the high ones, q in
// 0..15), then the 16 channels' fp16 scales, then their fp16 offsets (w = q * scale + offset): kBlock4
// bytes a channel a block. One activation dword broadcast meets 16 channels' weights in one
// multiply-accumulate, the block's integer sums come out a channel a lane, and its scales apply in one
// FMA a row: no sums across lanes anywhere. A group is read in address order, one stream. The last
// group of R < 16 channels (N not a multiple of 16) keeps R lanes: 4R-byte pieces, R scales, R offsets.
// The tensor keeps the shape [N, K / 2 + K / 8] (the same bytes), its rows no longer a channel's each.
#pragma once
#include <cstdint>

#include "cpu_stream.h"

namespace qdot {

constexpr int64_t kBlock = 32;       // activations and 4-bit weights: one scale per 32 inputs
constexpr int64_t kChunk = 8;        // blocks per interleaved chunk (the 8 int32 lanes of 256 bits)
constexpr int64_t kBlock4 = 20;      // a 4-bit channel's bytes a block: 16 of weights, an fp16 scale and offset
constexpr int64_t kLanes4 = 16;      // 4-bit weights: output channels a group (a 512-bit vector's fp32 lanes)
constexpr int64_t kGroup4 = kLanes4 * kBlock4;  // a whole group's bytes a block
constexpr int kMaxRows = 4;          // rows per kernel pass

struct Args {
  const int8_t* xq;     // [M, kp] activations quantized to int8 (-127..127), interleaved, zero past K
  const float* xs;      // [M, gp] their scale per block of 32 (zero past G)
  const float* xsum;    // [M, gp] the fp32 sum of each block of x (4-bit weights' offset term; zero past G)
  const int32_t* xqs;   // [M, gp] 128 x the integer sum of each block of xq (int8 weights' offset-binary term)
  int64_t K, N, kp, gp;  // inputs, outputs, the activations' row strides (bytes, blocks)
  const void* w;        // int8 [N, K] (signed), or 4-bit groups [N, K / 2 + 4G] (above: blocks of weights, scales, offsets)
  const float* scale8;  // int8: [N] fp32, one scale per output channel
  float* y;             // [M, N]
  const float* bias;    // [N] added to the product, or null
  const float* resid;   // [M, N] added after the bias (y = resid + (x . w + bias)), or null
};

// 4 bytes at p as an int32 (a broadcast activation step). Static: each ISA's file keeps its own copy.
static inline int32_t dword(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Rows [m0, m0 + rows) (rows <= kMaxRows) of y for output channels [n0, n1) (4-bit: n0 a multiple of kLanes4).
using RowsFn = void (*)(const Args&, int64_t m0, int rows, int64_t n0, int64_t n1);

namespace avx2 { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }
namespace vnni256 { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }
namespace vnni512 { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }
namespace avxvnni { void int8_rows(const Args&, int64_t, int, int64_t, int64_t); void int4_rows(const Args&, int64_t, int, int64_t, int64_t); }

// AMX-INT8 (cpu_qdot_amx.cpp): rows [0, m_end) (a multiple of kRows) of y for output channels [n0, n1)
// (at most kGroups * kCols of them), from `xb`, the rows' quantized activations in block order
// [m_end, K] (not interleaved), and `scratch`, panel_bytes(K) bytes (64-byte aligned) of the caller's.
namespace amx {
constexpr int kRows = 16;    // activation rows a tile
constexpr int kCols = 16;    // output channels a tile (a 512-bit vector's fp32 lanes)
constexpr int kGroups = 4;   // tiles of channels a panel: 64 channels, cpu_qdot.cpp's kTile
bool enable();               // asks Linux for the tile state once a process; false: tiles unusable
int64_t panel_bytes(int64_t K);
void int8_tiles(const Args&, const int8_t* xb, int64_t m_end, int64_t n0, int64_t n1, uint8_t* scratch);
void int4_tiles(const Args&, const int8_t* xb, int64_t m_end, int64_t n0, int64_t n1, uint8_t* scratch);
}  // namespace amx

}  // namespace qdot
