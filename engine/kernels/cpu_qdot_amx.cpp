// The AMX-INT8 form of the integer kernels (cpu_qdot.h): many rows of activations times int8 or 4-bit
// weights through tile multiplies (Sapphire Rapids and later Xeons), 16 rows and 16 output channels a
// tile, one block of 32 inputs a multiply. Rows that do not fill a 16-row tile take the AVX-512 VNNI
// row kernels (cpu_qdot.cpp), whose bits these are.
//
// What a tile computes: C[m][n] = sum over the 32 inputs of block g of xq[m] * w[n] (tdpbssd: signed
// bytes, exact int32 sums; a 4-bit weight's q in 0..15 is a non-negative signed byte). Then, per row m
// and channel n, the float operations of the row kernels in their order (cpu_qdot_body.inc):
//   int8:  block g to lane g % 8 of eight running sums, acc[l] = fma(float(C), xs[m, g], acc[l]);
//          y = hsum8(acc) * scale[n], hsum8's order ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
//   4-bit: block after block, acc = fma(float(C), scale[n, g] * xs[m, g], acc);
//          off = fma(offset[n, g], xsum[m, g], off);  y = acc + off;
// then the bias and the residual, so that a row gets the same bits here as through any other form, alone
// or among others. This restates the row kernels' float sequence; the build's check (cpu_qdot.py
// `_checked`) holds it to their bits: a difference fails this form, and the next one serves. Sixteen
// channels sit in a 512-bit vector's lanes, with the 16 rows' accumulators in registers.
//
// The operands: a tile's rows are contiguous bytes, so the activations come in block order (cpu_qdot.cpp
// puts the interleaved rows' dwords back) and a panel of up to 64 channels has its weights laid
// out once a call as the tiles read them (`panel`): per block and 16 channels, 8 rows of 64 bytes (the
// block's 4-byte quads, 16 channels' side by side), 4-bit weights unpacked to a byte each, their fp16
// scales and offsets to fp32. The panel then serves every 16-row block of the call from L2.
//
// Plain C++ compiled for these ISAs (the pragma), reached only through cpu_qdot.cpp's dispatch after
// cpuid says AMX-INT8 and Linux has granted the tile state (`enable`).
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,amx-tile,amx-int8")
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "cpu_qdot.h"

namespace qdot::amx {
namespace {

// No std:: templates in a file compiled for these ISAs (cpu_qdot_body.inc says why).
inline int64_t least(int64_t x, int64_t y) { return x < y ? x : y; }

constexpr int64_t kTileBytes = 8 * 64;  // a block's weights for 16 channels: 8 quads x 16 x 4 bytes

struct alignas(64) Config {  // ldtilecfg's palette 1
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles: 0 the activations (16 rows x a block's 32 bytes), 1 the weights (8 quads x 16 channels x 4
// bytes), 2 the integer sums (16 rows x 16 int32).

// Set on every panel: another library (oneDNN) may configure the tiles its own way on the same thread
// between our calls (and `rows` gives its configuration back).
inline void configure() {
  Config c;
  std::memset(&c, 0, sizeof c);
  c.palette = 1;
  c.rows[0] = kRows, c.colsb[0] = 32;
  c.rows[1] = 8, c.colsb[1] = 64;
  c.rows[2] = kRows, c.colsb[2] = 64;
  _tile_loadconfig(&c);
}

struct Panel {  // a panel's weights as the tiles read them (module comment), in the caller's scratch
  int8_t* tiles;  // [G][kGroups][kTileBytes]
  float* scale;   // 4-bit: [G][kGroups * 16] fp32
  float* offset;  // 4-bit: the same
};

Panel carve(uint8_t* scratch, int64_t G) {
  int8_t* t = reinterpret_cast<int8_t*>(scratch);
  float* s = reinterpret_cast<float*>(scratch + G * kGroups * kTileBytes);
  return {t, s, s + G * kGroups * kCols};
}

// int8: channel n's 4-byte quad r of block g, in chunk c = g / 8 of `lanes` blocks, is dword lanes * r + g % 8
// of its row's 256-byte chunk (cpu_qdot.h): gathered, 16 channels a quad. 4-bit: a group's block is one
// record, its quad r < 4 (low nibbles: quad r; high: quad r + 4) 16 channels' side by side already.
void lay_out(const Args& a, bool four, int64_t n0, int64_t n1, const Panel& p) {
  const int64_t G = a.K / kBlock, row = four ? G * kBlock4 : a.K;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + n0 * row;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < kGroups; ++j) {
    const int64_t c0 = n0 + j * kCols, have = (n1 > c0 ? least(kCols, n1 - c0) : 0);
    const __mmask16 live = static_cast<__mmask16>((1u << have) - 1u);
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int>(row)));
    const uint8_t* wj = w + j * kCols * row;
    for (int64_t g = 0; g < G; ++g) {
      int8_t* dst = p.tiles + (g * kGroups + j) * kTileBytes;
      if (!four) {
        const int64_t c = g / kChunk, lanes = least(kChunk, G - c * kChunk), i = g % kChunk;
        for (int r = 0; r < 8; ++r)
          _mm512_store_si512(dst + r * 64, have ? _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, at,
                                                                              wj + c * 256 + (lanes * r + i) * 4, 1)
                                                : _mm512_setzero_si512());
        continue;
      }
      const uint8_t* rec = wj + g * kBlock4 * have;  // the group's R = have channels: 20R bytes a block
      for (int r = 0; r < 4; ++r) {
        const __m512i v = _mm512_maskz_loadu_epi32(live, rec + 4 * have * r);
        _mm512_store_si512(dst + r * 64, _mm512_and_si512(v, low));
        _mm512_store_si512(dst + (r + 4) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
      }
      const __m256i s16 = _mm256_maskz_loadu_epi16(live, rec + 16 * have), o16 = _mm256_maskz_loadu_epi16(live, rec + 18 * have);
      _mm512_store_ps(p.scale + g * kGroups * kCols + j * kCols, _mm512_cvtph_ps(s16));
      _mm512_store_ps(p.offset + g * kGroups * kCols + j * kCols, _mm512_cvtph_ps(o16));
    }
  }
}

// int8: the 16 rows' eight lane sums of one group of 16 channels (module comment), sums[l][m] a vector
// of the channels. 4-bit: each row's whole sum acc + off in sums[0][m]. A block's multiply, then its
// float work, then the next block's: issuing multiplies ahead of the float work, into other tiles and
// buffers, ran slower (docs/quantization-amx-2026-12-06.md).
void group(const Args& a, bool four, const int8_t* xb, int64_t m0, int j, const Panel& p, __m512 (*sums)[kRows]) {
  const int64_t G = a.K / kBlock, gp = a.gp, lanes = four ? 1 : (G < kChunk ? G : kChunk), stride = four ? 1 : kChunk;
  const float* xs = a.xs + m0 * gp;
  const float* xsum = a.xsum + m0 * gp;
  alignas(64) int32_t c[kRows * kCols];
  for (int l = 0; l < lanes; ++l) {
    __m512 acc[kRows], off[kRows];
    for (int m = 0; m < kRows; ++m) acc[m] = off[m] = _mm512_setzero_ps();
    for (int64_t g = l; g < G; g += stride) {
      _tile_loadd(0, xb + m0 * a.K + g * kBlock, a.K);
      _tile_loadd(1, p.tiles + (g * kGroups + j) * kTileBytes, 64);
      _tile_zero(2);
      _tile_dpbssd(2, 0, 1);
      _tile_stored(2, c, 64);
      if (four) {
        const __m512 s = _mm512_load_ps(p.scale + (g * kGroups + j) * kCols);
        const __m512 o = _mm512_load_ps(p.offset + (g * kGroups + j) * kCols);
        for (int m = 0; m < kRows; ++m) {
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + m * kCols)),
                                   _mm512_mul_ps(s, _mm512_set1_ps(xs[m * gp + g])), acc[m]);
          off[m] = _mm512_fmadd_ps(o, _mm512_set1_ps(xsum[m * gp + g]), off[m]);
        }
      } else {
        for (int m = 0; m < kRows; ++m)
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + m * kCols)), _mm512_set1_ps(xs[m * gp + g]),
                                   acc[m]);
      }
    }
    for (int m = 0; m < kRows; ++m) sums[l][m] = four ? _mm512_add_ps(acc[m], off[m]) : acc[m];
  }
  for (int64_t l = lanes; l < kChunk; ++l)  // lanes past a short row's blocks stay zero, as in hsum8
    for (int m = 0; m < kRows; ++m) sums[l][m] = _mm512_setzero_ps();
}

void row_block(const Args& a, bool four, const int8_t* xb, int64_t m0, int64_t n0, int64_t n1, const Panel& p) {
  __m512 sums[kChunk][kRows];
  for (int j = 0; j < kGroups; ++j) {
    const int64_t c0 = n0 + j * kCols, have = least(kCols, n1 - c0);
    if (have <= 0) break;
    group(a, four, xb, m0, j, p, sums);
    const __mmask16 live = static_cast<__mmask16>((1u << have) - 1u);
    const __m512 scale = four ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(live, a.scale8 + c0);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(live, a.bias + c0) : _mm512_setzero_ps();
    for (int m = 0; m < kRows; ++m) {
      __m512 v = sums[0][m];
      if (!four) {  // hsum8's order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
        const __m512 h0 = _mm512_add_ps(sums[0][m], sums[4][m]), h1 = _mm512_add_ps(sums[1][m], sums[5][m]);
        const __m512 h2 = _mm512_add_ps(sums[2][m], sums[6][m]), h3 = _mm512_add_ps(sums[3][m], sums[7][m]);
        v = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(h0, h2), _mm512_add_ps(h1, h3)), scale);
      }
      if (a.bias) v = _mm512_add_ps(v, bias);
      if (a.resid) v = _mm512_add_ps(_mm512_maskz_loadu_ps(live, a.resid + (m0 + m) * a.N + c0), v);
      _mm512_mask_storeu_ps(a.y + (m0 + m) * a.N + c0, live, v);
    }
  }
}

// The thread's tile configuration is saved and given back, so that a library that configures its tiles
// once and keeps them (oneDNN's AMX matmuls run on the same threads) finds them as it left them.
void rows(const Args& a, bool four, const int8_t* xb, int64_t m_end, int64_t n0, int64_t n1, uint8_t* scratch) {
  const Panel p = carve(scratch, a.K / kBlock);
  lay_out(a, four, n0, n1, p);
  Config before;
  _tile_storeconfig(&before);
  configure();
  for (int64_t m0 = 0; m0 < m_end; m0 += kRows) row_block(a, four, xb, m0, n0, n1, p);
  if (before.palette)
    _tile_loadconfig(&before);
  else
    _tile_release();
}

}  // namespace

bool enable() {  // Linux hands a process the tile state on request (arch_prctl ARCH_REQ_XCOMP_PERM)
  constexpr long kReqPerm = 0x1023, kTileData = 18;
  return syscall(SYS_arch_prctl, kReqPerm, kTileData) == 0;
}

int64_t panel_bytes(int64_t K) { return (K / kBlock) * kGroups * (kTileBytes + 2 * kCols * 4); }

void int8_tiles(const Args& a, const int8_t* xb, int64_t m_end, int64_t n0, int64_t n1, uint8_t* scratch) {
  rows(a, false, xb, m_end, n0, n1, scratch);
}
void int4_tiles(const Args& a, const int8_t* xb, int64_t m_end, int64_t n0, int64_t n1, uint8_t* scratch) {
  rows(a, true, xb, m_end, n0, n1, scratch);
}

}  // namespace qdot::amx
