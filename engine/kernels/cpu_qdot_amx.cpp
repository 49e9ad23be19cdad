// The AMX-INT8 form of the integer kernels (cpu_qdot.h): many rows of activations times int8 or 4-bit
// weights through tile multiplies (Sapphire Rapids and later Xeons), 16 rows and 16 output channels a
// tile, one block of 32 inputs a multiply. Rows that do not fill a 16-row tile take the AVX-512 VNNI
// row kernels (cpu_qdot.cpp), whose bits these are.
//
// What a tile computes: C[m][n] = sum over the 32 inputs of block g of xq[m] * w[n] (tdpbssd: signed
// bytes, exact int32 sums; a 4-bit weight's q in 0..15 is a non-negative signed byte). Then, per row m
// and channel n, the float operations of the row kernels in their order (cpu_qdot_body.inc), block
// after block: int8, acc = fma(float(C), xs[m, g], acc), y = acc * scale[n]; 4-bit, acc = fma(float(C),
// scale[n, g] * xs[m, g], acc), off = fma(offset[n, g], xsum[m, g], off), y = acc + off; then the bias
// and the residual, so that a row gets the same bits here as through any other form, alone or among
// others. This restates the row kernels' float sequence; the build's check (cpu_qdot.py `_checked`)
// holds it to their bits: a difference fails this form, and the next one serves. Sixteen channels sit in
// a 512-bit vector's lanes, with the 16 rows' accumulators in registers.
//
// The operands: a tile's rows are contiguous bytes, so the activations come in block order (cpu_qdot.cpp
// puts the interleaved rows' dwords back) and a panel of up to 64 channels has its weights laid
// out once a call as the tiles read them (`panel`): per block and 16 channels, 8 rows of 64 bytes (the
// block's 4-byte quads, 16 channels' side by side, as the groups hold them), 4-bit weights unpacked to a
// byte each, their fp16 scales and offsets to fp32. The panel then serves every 16-row block of the call from L2.
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

// A group's block is one record (cpu_qdot.h): its quads r (int8: 8; 4-bit: 4, the low nibbles quad r and
// the high ones quad r + 4) hold 16 channels' 4 bytes side by side already; a last group of R < 16
// channels R of them, loaded under a mask.
void lay_out(const Args& a, bool four, int64_t n0, int64_t n1, const Panel& p) {
  const int64_t G = a.K / kBlock, row = four ? G * kBlock4 : a.K, unit = four ? kBlock4 : kBlock;
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + n0 * row;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < kGroups; ++j) {
    const int64_t c0 = n0 + j * kCols, have = (n1 > c0 ? least(kCols, n1 - c0) : 0);
    const __mmask16 live = static_cast<__mmask16>((1u << have) - 1u);
    const uint8_t* wj = w + j * kCols * row;
    for (int64_t g = 0; g < G; ++g) {
      int8_t* dst = p.tiles + (g * kGroups + j) * kTileBytes;
      const uint8_t* rec = wj + g * unit * have;  // the group's R = have channels: unit * R bytes a block
      if (!four) {
        for (int r = 0; r < 8; ++r) _mm512_store_si512(dst + r * 64, _mm512_maskz_loadu_epi32(live, rec + 4 * have * r));
        continue;
      }
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

// The 16 rows' sums over every block of one group of 16 channels (module comment), sums[m] a vector of
// the channels (4-bit: acc + off; int8: acc, its channel scales not yet applied). A block's multiply,
// then its float work, then the next block's: issuing multiplies ahead of the float work, into other
// tiles and buffers, ran slower (docs/quantization-amx-2026-12-06.md).
void group(const Args& a, bool four, const int8_t* xb, int64_t m0, int j, const Panel& p, __m512* sums) {
  const int64_t G = a.K / kBlock, gp = a.gp;
  const float* xs = a.xs + m0 * gp;
  const float* xsum = a.xsum + m0 * gp;
  alignas(64) int32_t c[kRows * kCols];
  __m512 acc[kRows], off[kRows];
  for (int m = 0; m < kRows; ++m) acc[m] = off[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
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
  for (int m = 0; m < kRows; ++m) sums[m] = four ? _mm512_add_ps(acc[m], off[m]) : acc[m];
}

void row_block(const Args& a, bool four, const int8_t* xb, int64_t m0, int64_t n0, int64_t n1, const Panel& p) {
  __m512 sums[kRows];
  for (int j = 0; j < kGroups; ++j) {
    const int64_t c0 = n0 + j * kCols, have = least(kCols, n1 - c0);
    if (have <= 0) break;
    group(a, four, xb, m0, j, p, sums);
    const __mmask16 live = static_cast<__mmask16>((1u << have) - 1u);
    const __m512 scale = four ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(live, a.scale8 + c0);
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(live, a.bias + c0) : _mm512_setzero_ps();
    for (int m = 0; m < kRows; ++m) {
      __m512 v = four ? sums[m] : _mm512_mul_ps(sums[m], scale);
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
