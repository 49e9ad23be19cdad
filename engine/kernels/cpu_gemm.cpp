// Weight-only int8 and int4 matmuls and fp32 products, AVX2 + FMA + F16C: decode steps first, prefill rows too.
//
// Why hand-written: torch's own weight-only kernels (_weight_int8pack_mm, _weight_int4pack_mm_for_cpu)
// read the weights far below what memory delivers on a one-row product on an AVX2-only CPU
// (`python -m engine.bench gemv`; docs/quantization.md), and a decode step is nothing but such
// products. engine/kernels/cpu_gemm.py builds this file at first use, checks it, and owns the
// fallback to torch's kernels.
//
// Layouts (engine/kernels/cpu_gemm.py packs them); rows are split across torch's own OpenMP threads.
//   int8: w [N, K] int8, scale [N] fp32: y[m, n] = scale[n] * sum_k x[m, k] w[n, k], in fp32
//         (each weight converted to float in registers: the dequantized product).
//   int4: w [N, K/2] uint8, groups of 32 inputs in 16 bytes: byte j holds q[j] (low nibble) and
//         q[j + 16] (high); scale, offset [N, K/32] fp16: w[n, k] = q * scale + offset, so
//         y = sum_g scale_g (x . q)_g + offset_g * sum_g(x). x is quantized to int16 per group for
//         the (x . q) products; the sums of x stay fp32.
//   fp32: panels [ceil(N/16), K, 16] of the weight (see fp32_mm below).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <torch/library.h>

#include "cpu_stream.h"
#include "cpu_tiles.h"

namespace {

constexpr int kBlockRows = 4;    // rows per kernel call: their accumulators fit the 16 ymm registers
constexpr int64_t kTile = 64;    // many rows: output channels per tile, their weights kept in L2 across row blocks

// The weight-only kernels: every row block of x over every tile of output channels (cpu_tiles.h).
template <typename Rows>
void over_tiles(int64_t M, int64_t N, Rows&& rows) {
  const int64_t tile = tiles::size(N, M <= kBlockRows, kTile, 16);
  tiles::run((N + tile - 1) / tile, [&](int64_t t) {
    const int64_t n0 = t * tile, n1 = std::min(N, n0 + tile);
    for (int64_t m0 = 0; m0 < M; m0 += kBlockRows) rows(m0, std::min<int64_t>(kBlockRows, M - m0), n0, n1);
  });
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 bytes_to_ps_s8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

template <int M>
void int8_rows(const float* x, int64_t K, const int8_t* w, const float* scale, float* y, int64_t N,
               int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* wr = w + n * K;
    stream::ahead(wr, K);
    __m256 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + k));
      __m256 w0 = bytes_to_ps_s8(b), w1 = bytes_to_ps_s8(_mm_srli_si128(b, 8));
      for (int m = 0; m < M; ++m) {
        acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * K + k), acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * K + k + 8), acc[m][1]);
      }
    }
    for (int m = 0; m < M; ++m) {
      float s = hsum(_mm256_add_ps(acc[m][0], acc[m][1]));
      for (int64_t t = k; t < K; ++t) s += x[m * K + t] * wr[t];
      y[m * N + n] = s * scale[n];
    }
  }
}

// fp32 (or bf16) weights in panels of kPanel output channels, [P, K, kPanel] (engine/kernels/cpu_gemm.py:
// fp32_panels; the last panel padded with zeros). The micro-kernel is the classic GEMM one: each x value is
// broadcast against two panels' 32 outputs, so one weight load serves several rows and one x load 32
// outputs. Every output sums its K products in order, one FMA chain per lane: a row's bits depend
// neither on how many rows share the call, nor on how rows and panels are blocked, nor on the vector
// width, so the AVX-512 kernel (8 rows a pass: a batch's 8 decode rows read the weights once) and the
// AVX2 one (3 rows: 12 accumulators of its 16 registers) give the same bits. A one-row product
// streams the weights at close to memory speed; many rows run at oneDNN's speed (engine.bench gemv).
constexpr int kPanel = 16;
constexpr int kPanelRows = 3;      // AVX2: rows per micro-kernel call (3 rows x 2 panels x 2 vectors)
constexpr int kPanelRowsWide = 8;  // AVX-512: 8 rows x 2 panels = 16 of its 32 registers
constexpr int kTilePanels = 2;     // many rows: panels a tile, their weights kept in L2 across the row blocks

// A panel row's weights as fp32 lanes: fp32 as they are; bf16 (W = uint16_t) widened exactly, its 16 bits
// being an fp32's top half. So bf16 panels give the fp32 product of the bf16 weights, in the same FMA order.
inline __m256 wload8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 wload8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
__attribute__((target("avx512f"))) inline __m512 wload16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 wload16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

template <int M, int P, typename W>
inline void fp32_block(const float* x, int64_t K, const W* w, float* y, int64_t ldy) {
  __m256 acc[M][2 * P];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 2 * P; ++j) acc[m][j] = _mm256_setzero_ps();
  const W* panel[P];
  for (int p = 0; p < P; ++p) panel[p] = w + p * K * kPanel;
  for (int64_t k = 0; k < K; ++k) {
    __m256 b[2 * P];
    for (int p = 0; p < P; ++p) {
      b[2 * p] = wload8(panel[p] + k * kPanel);
      b[2 * p + 1] = wload8(panel[p] + k * kPanel + 8);
      stream::ahead(panel[p] + k * kPanel, sizeof(W) * kPanel);
    }
    for (int m = 0; m < M; ++m) {
      const __m256 a = _mm256_broadcast_ss(x + m * K + k);
      for (int j = 0; j < 2 * P; ++j) acc[m][j] = _mm256_fmadd_ps(a, b[j], acc[m][j]);
    }
  }
  // Plain stores only: a store that depends on a runtime bound made GCC keep the accumulators on the
  // stack through the loop (slower: docs/history.md); the last, padded panel goes through a scratch block instead.
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 2 * P; ++j) _mm256_storeu_ps(y + m * ldy + 8 * j, acc[m][j]);
}

// The same arithmetic with one 16-lane vector per panel (each lane's FMA chain is the same).
template <int M, int P, typename W>
__attribute__((target("avx512f"))) void fp32_block_wide(const float* x, int64_t K, const W* w, float* y,
                                                        int64_t ldy) {
  __m512 acc[M][P];
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p) acc[m][p] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[P];
    for (int p = 0; p < P; ++p) b[p] = wload16(w + (p * K + k) * kPanel);
    for (int p = 0; p < P; ++p) stream::ahead(w + (p * K + k) * kPanel, sizeof(W) * kPanel);
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_set1_ps(x[m * K + k]);
      for (int p = 0; p < P; ++p) acc[m][p] = _mm512_fmadd_ps(a, b[p], acc[m][p]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(y + m * ldy + kPanel * p, acc[m][p]);
}

template <int M, int P, bool Wide, typename W>
inline void fp32_call(const float* x, int64_t K, const W* w, float* y, int64_t ldy) {
  if constexpr (Wide) fp32_block_wide<M, P>(x, K, w, y, ldy);
  else fp32_block<M, P>(x, K, w, y, ldy);
}

// Panels [p0, p1) for M rows (one micro-kernel pass): pairs of panels, a lone one, the padded last one.
template <int M, bool Wide, typename W>
void fp32_rows(const float* x, int64_t K, const W* w, float* y, int64_t N, int64_t p0, int64_t p1) {
  int64_t p = p0;
  for (; p + 2 <= p1 && (p + 2) * kPanel <= N; p += 2) fp32_call<M, 2, Wide>(x, K, w + p * K * kPanel, y + p * kPanel, N);
  for (; p < p1; ++p) {
    if ((p + 1) * kPanel <= N) {
      fp32_call<M, 1, Wide>(x, K, w + p * K * kPanel, y + p * kPanel, N);
      continue;
    }
    alignas(64) float part[M * kPanel];
    fp32_call<M, 1, Wide>(x, K, w + p * K * kPanel, part, kPanel);
    for (int m = 0; m < M; ++m)
      for (int64_t n = p * kPanel; n < N; ++n) y[m * N + n] = part[m * kPanel + n - p * kPanel];
  }
}

// fp32_rows for a run-time row count 1..R: one instantiation per count, so each keeps its accumulators in registers.
template <int R, bool Wide, typename W>
void fp32_rows_upto(int64_t rows, const float* x, int64_t K, const W* w, float* y, int64_t N, int64_t p0,
                    int64_t p1) {
  if constexpr (R > 1) {
    if (rows < R) return fp32_rows_upto<R - 1, Wide>(rows, x, K, w, y, N, p0, p1);
  }
  fp32_rows<R, Wide>(x, K, w, y, N, p0, p1);
}

inline float half_to_float(at::Half h) { return _cvtsh_ss(h.x); }  // F16C, not c10's bit-twiddling

// x quantized to int16 per group of 32 inputs (xq, with one fp32 scale per group, xs): the weights
// then need no conversion to float, only unpacking to int16, and two vpmaddwd multiply 32 of them.
// int16 keeps ~15 bits of each activation (int8, as llama.cpp's 4-bit dot products use, cost this
// model ~4 points of top-1 agreement against fp32 in a teacher-forced test). The offset term uses
// the exact fp32 sums of x. Two accumulators per row: consecutive groups' FMAs do not wait on each other.
inline __m256 group_dot(__m256i w0, __m256i w1, const int16_t* xq) {
  __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1)));
}

struct Unpacked { __m256i lo, hi; };  // q[0..15] and q[16..31] as int16

inline Unpacked unpack(const uint8_t* p, const __m128i low) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepu8_epi16(_mm_and_si128(b, low)), _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), low))};
}

template <int M>
void int4_rows(const int16_t* xq, const float* xs, const float* xsum, int64_t K, const uint8_t* w,
               const at::Half* scale, const at::Half* offset, float* y, int64_t N, int64_t n0, int64_t n1) {
  const int64_t groups = K / 32;
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w + n * (K / 2);
    stream::ahead(wr, K / 2);
    const at::Half* sr = scale + n * groups;
    const at::Half* orow = offset + n * groups;
    __m256 acc[M][2];
    __m256 off[M];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = off[m] = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 2 <= groups; g += 2) {
      const Unpacked q0 = unpack(wr + g * 16, low), q1 = unpack(wr + g * 16 + 16, low);
      const float s0 = half_to_float(sr[g]), s1 = half_to_float(sr[g + 1]);
      for (int m = 0; m < M; ++m) {
        const int16_t* x0 = xq + m * K + g * 32;
        acc[m][0] = _mm256_fmadd_ps(_mm256_set1_ps(s0 * xs[m * groups + g]), group_dot(q0.lo, q0.hi, x0), acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(_mm256_set1_ps(s1 * xs[m * groups + g + 1]), group_dot(q1.lo, q1.hi, x0 + 32), acc[m][1]);
      }
    }
    for (; g < groups; ++g) {
      const Unpacked q0 = unpack(wr + g * 16, low);
      const float s0 = half_to_float(sr[g]);
      for (int m = 0; m < M; ++m)
        acc[m][0] = _mm256_fmadd_ps(_mm256_set1_ps(s0 * xs[m * groups + g]), group_dot(q0.lo, q0.hi, xq + m * K + g * 32), acc[m][0]);
    }
    int64_t h = 0;  // the offsets' term, 8 groups at a time
    for (; h + 8 <= groups; h += 8) {
      const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(orow + h)));
      for (int m = 0; m < M; ++m) off[m] = _mm256_fmadd_ps(o, _mm256_loadu_ps(xsum + m * groups + h), off[m]);
    }
    for (int m = 0; m < M; ++m) {
      float o = hsum(off[m]);
      for (int64_t t = h; t < groups; ++t) o += half_to_float(orow[t]) * xsum[m * groups + t];
      y[m * N + n] = hsum(_mm256_add_ps(acc[m][0], acc[m][1])) + o;
    }
  }
}

// One dispatch on a block's row count (1 to kBlockRows), so each gets its accumulators in registers.
template <typename F>
void by_rows(int64_t M, F&& f) {
  static_assert(kBlockRows == 4, "one case per block size");
  switch (M) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "], got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "x must be a contiguous fp32 CPU tensor");
  TORCH_CHECK(x.size(0) >= 1, "x has no rows");
}

at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale) {
  const int64_t N = w.size(0), K = w.size(1), M = x.size(0);
  check_x(x, K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous(), "w must be contiguous int8 [N, K]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == N && scale.is_contiguous(), "scale: fp32 [N]");
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
    by_rows(rows, [&](auto r) { int8_rows<decltype(r)::value>(xp + m0 * K, K, wp, sp, yp + m0 * N, N, n0, n1); });
  });
  return y;
}

template <typename W>
void panel_product(const float* xp, int64_t M, int64_t K, const W* wp, int64_t P, float* yp, int64_t N, bool wide) {
  const int64_t R = wide ? kPanelRowsWide : kPanelRows;
  const int64_t tile = tiles::size(P, M <= R, kTilePanels, 1);
  tiles::run((P + tile - 1) / tile, [&](int64_t t) {
    const int64_t p0 = t * tile, p1 = std::min(P, p0 + tile);
    for (int64_t m0 = 0; m0 < M; m0 += R) {
      const int64_t rows = std::min(R, M - m0);
      if (wide) fp32_rows_upto<kPanelRowsWide, true>(rows, xp + m0 * K, K, wp, yp + m0 * N, N, p0, p1);
      else fp32_rows_upto<kPanelRows, false>(rows, xp + m0 * K, K, wp, yp + m0 * N, N, p0, p1);
    }
  });
}

// x [M, K] fp32 times panels of fp32 or bf16 weights (bf16: widened exactly), fp32 sums: y [M, N] fp32.
at::Tensor fp32_mm(const at::Tensor& x, const at::Tensor& panels, int64_t N, bool wide) {
  const int64_t K = x.size(1), M = x.size(0);
  check_x(x, K);
  const bool bf16 = panels.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || panels.scalar_type() == at::kFloat) && panels.is_contiguous() && panels.dim() == 3 &&
              panels.size(1) == K && panels.size(2) == kPanel && panels.size(0) * kPanel >= N && N > 0,
              "panels must be contiguous fp32 or bf16 [ceil(N / ", kPanel, "), K, ", kPanel, "] for N = ", N,
              ", got ", panels.scalar_type(), " ", panels.sizes());
  TORCH_CHECK(!wide || __builtin_cpu_supports("avx512f"), "the wide fp32 kernel needs AVX-512, which this CPU lacks");
  at::Tensor y = at::empty({M, N}, x.options());
  if (bf16)
    panel_product(x.data_ptr<float>(), M, K, reinterpret_cast<const uint16_t*>(panels.data_ptr<at::BFloat16>()),
                  panels.size(0), y.data_ptr<float>(), N, wide);
  else
    panel_product(x.data_ptr<float>(), M, K, panels.data_ptr<float>(), panels.size(0), y.data_ptr<float>(), N, wide);
  return y;
}

at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, const at::Tensor& offset,
                     int64_t group_size) {
  const int64_t N = w.size(0), K = w.size(1) * 2, M = x.size(0);
  check_x(x, K);
  TORCH_CHECK(group_size == 32 && K % 32 == 0, "groups of 32 inputs only, K a multiple of 32");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous(), "w must be contiguous uint8 [N, K/2]");
  const int64_t groups = K / group_size;
  for (const at::Tensor* t : {&scale, &offset})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->numel() == N * groups,
                "scale and offset: fp16 [N, K/group]");
  const int64_t chunks = K / 32;
  at::Tensor xsum = at::empty({M, groups}, x.options());  // per row and group: sum of x, shared by every n
  at::Tensor xscale = at::empty({M, chunks}, x.options());
  at::Tensor xq = at::empty({M, K}, x.options().dtype(at::kShort));
  const float* xp = x.data_ptr<float>();
  float* xsump = xsum.data_ptr<float>();
  float* xsp = xscale.data_ptr<float>();
  int16_t* xqp = xq.data_ptr<int16_t>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t c = 0; c < chunks; ++c) {
      const float* xc = xp + m * K + c * 32;
      float amax = 0.f, sum = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(xc[i])), sum += xc[i];
      const float s = amax / 32767.f, inv = s > 0.f ? 1.f / s : 0.f;
      xsp[m * chunks + c] = s;
      xsump[m * groups + c] = sum;
      for (int i = 0; i < 32; ++i) xqp[m * K + c * 32 + i] = static_cast<int16_t>(std::nearbyint(xc[i] * inv));
    }
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const at::Half* sp = scale.data_ptr<at::Half>();
  const at::Half* op = offset.data_ptr<at::Half>();
  float* yp = y.data_ptr<float>();
  over_tiles(M, N, [&](int64_t m0, int64_t rows, int64_t n0, int64_t n1) {
    by_rows(rows, [&](auto r) {
      int4_rows<decltype(r)::value>(xqp + m0 * K, xsp + m0 * groups, xsump + m0 * groups, K, wp, sp, op,
                                    yp + m0 * N, N, n0, n1);
    });
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(latency_lab_gemv, m) {
  m.def("fp32_mm(Tensor x, Tensor panels, int n, bool wide) -> Tensor");
  m.def("int8_gemv(Tensor x, Tensor w, Tensor scale) -> Tensor");
  m.def("int4_gemv(Tensor x, Tensor w, Tensor scale, Tensor offset, int group_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(latency_lab_gemv, CPU, m) {
  m.impl("fp32_mm", &fp32_mm);
  m.impl("int8_gemv", &int8_gemv);
  m.impl("int4_gemv", &int4_gemv);
}
