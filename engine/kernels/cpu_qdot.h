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
// The weights: groups of kLanes = 16 output channels side by side, a channel a 32-bit lane (as the fp32
// panels of cpu_gemm.cpp), block after block of 32 inputs; each block a record:
//   int8:  8 pieces of 64 bytes, piece s each channel's bytes 4s..4s+3 of the block (kGroup8 bytes);
//          the fp32 scales, one a channel, in a tensor of their own;
//   4-bit: 4 pieces of 64 bytes, piece j each channel's 4 bytes of weights 4j..4j+3 in the low nibbles,
//          16+4j..16+4j+3 in the high ones (q in 0..15), then the 16 channels' fp16 scales, then their
//          fp16 offsets (w = q * scale + offset): kBlock4 bytes a channel a block, kGroup4 a group.
// One broadcast activation dword meets 16 channels' weights in one multiply-accumulate, a block's integer
// sums come out a channel a lane, and its scales apply in one FMA a row: no sums across lanes anywhere. A
// group is read in address order, one stream. The last group of R < 16 channels (N not a multiple of
// 16) keeps R lanes: 4R-byte pieces (and R scales, R offsets). The tensors keep their shapes ([N, K]
// int8, [N, K / 2 + K / 8] 4-bit: the same bytes), their rows no longer a channel's each.
//
// The quantized activations (the kernels' scratch, per row) are interleaved: a row is cut into chunks
// of 8 blocks; in a chunk, 32-byte step s holds bytes 4s..4s+3 of block i in its int32 lane i, and a
// last chunk of T < 8 blocks keeps T lanes a step (4T-byte steps, dword T * s + i; zero past its 8T
// dwords). So block i's step s is the dword 8s + i of its chunk (T s + i in the last): the kernels
// broadcast it from there.
#pragma once
#include <cstdint>

#include "cpu_stream.h"

namespace qdot {

constexpr int64_t kBlock = 32;       // activations and 4-bit weights: one scale per 32 inputs
constexpr int64_t kChunk = 8;        // blocks per interleaved chunk of the activations
constexpr int64_t kBlock4 = 20;      // a 4-bit channel's bytes a block: 16 of weights, an fp16 scale and offset
constexpr int64_t kLanes = 16;       // output channels a group of weights (a 512-bit vector's fp32 lanes)
constexpr int64_t kGroup4 = kLanes * kBlock4;   // a whole 4-bit group's bytes a block
constexpr int64_t kGroup8 = kLanes * kBlock;    // a whole int8 group's bytes a block
constexpr int kMaxRows = 4;          // rows per kernel pass

struct Args {
  const int8_t* xq;     // [M, kp] activations quantized to int8 (-127..127), interleaved, zero past K
  const float* xs;      // [M, gp] their scale per block of 32 (zero past G)
  const float* xsum;    // [M, gp] the fp32 sum of each block of x (4-bit weights' offset term; zero past G)
  const int32_t* xqs;   // [M, gp] 128 x the integer sum of each block of xq (int8 weights' offset-binary term)
  int64_t K, N, kp, gp;  // inputs, outputs, the activations' row strides (bytes, blocks)
  const void* w;        // int8 groups [N, K] (signed), or 4-bit groups [N, K / 2 + 4G] (above)
  const float* scale8;  // int8: [N] fp32, one scale per output channel
  float* y;             // [M, N]
  const float* bias;    // [N] added to the product, or null
  const float* resid;   // [M, N] added after the bias (y = resid + (x . w + bias)), or null
  bool fetch = true;    // a group's blocks also asked for kAhead on (cpu_stream.h); false: the hardware's prefetchers alone
};

// 4 bytes at p as an int32 (a broadcast activation step). Static: each ISA's file keeps its own copy.
static inline int32_t dword(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Rows [m0, m0 + rows) (rows <= kMaxRows) of y for output channels [n0, n1) (n0 a multiple of kLanes).
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
