// Integer dot-product products for int8 and 4-bit weights: activations quantized to int8 per block of
// 32 on the fly (llama.cpp's Q8_0, ONNX Runtime's MatMulNBits accuracy level 4), weights multiplied as
// integers (vpmaddubsw/vpmaddwd on AVX2, vpdpbusd with AVX-512 VNNI or AVX-VNNI), one float scale per
// block. engine/kernels/cpu_qdot.py picks the ISA from the detected capabilities and checks it.
//
// Why separate files per ISA with runtime dispatch (cpu_qdot.h), not target attributes: a `#pragma GCC
// target` per file makes every intrinsic of that ISA legal in the shared templated body, and no torch
// header is ever compiled with AVX-512 flags (an inline function of it could otherwise be the copy the
// linker keeps, and run on an AVX2 CPU).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <tuple>
#include <immintrin.h>
#include <torch/library.h>

#include "cpu_qdot.h"

namespace {

using qdot::kBlock;

enum Isa : int64_t { kAvx2 = 1, kVnni512 = 2, kAvxVnni = 4 };  // cpu_qdot.py ISAS

int64_t supported_isas() {  // cpuid, as the CPU that runs the code reports it (an emulator's, not /proc's)
  __builtin_cpu_init();
  int64_t mask = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) mask |= kAvx2;
  if ((mask & kAvx2) && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw"))
    mask |= kVnni512;
  if ((mask & kAvx2) && __builtin_cpu_supports("avxvnni")) mask |= kAvxVnni;
  return mask;
}

std::pair<qdot::RowsFn, qdot::RowsFn> kernels(int64_t isa) {
  TORCH_CHECK(isa == kAvx2 || isa == kVnni512 || isa == kAvxVnni, "unknown integer-kernel ISA ", isa);
  TORCH_CHECK(supported_isas() & isa, "this CPU lacks the instructions of integer-kernel ISA ", isa);
  if (isa == kVnni512) return {&qdot::vnni512::int8_rows, &qdot::vnni512::int4_rows};
  if (isa == kAvxVnni) return {&qdot::avxvnni::int8_rows, &qdot::avxvnni::int4_rows};
  return {&qdot::avx2::int8_rows, &qdot::avx2::int4_rows};
}

// x [M, K] fp32 -> int8 per block of 32: s = max|x| / 127, q = round-half-even(x * (1 / s)) (0 where
// the block is all zeros), and the block's exact fp32 sum (left to right). engine/kernels/cpu_qdot.py
// `quantize_reference` is the same arithmetic in torch (tested bit for bit). `pairs`: the 4-bit
// kernel's order, blocks g, g + 1 (g even) as [g 0..15 | g+1 0..15 | g 16..31 | g+1 16..31] (the order
// its unpacked nibbles come in: cpu_qdot_body.inc); a last, lone block stays in order.
int64_t position(int64_t g, int64_t G, int i, bool pairs) {
  if (!pairs || (g % 2 == 0 && g + 1 == G)) return g * kBlock + i;
  const int64_t base = (g - g % 2) * kBlock + (g % 2) * 16;
  return base + (i < 16 ? i : 32 + i - 16);
}

void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* xs, float* xsum, bool pairs) {
  const int64_t G = K / kBlock;
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t m = r0; m < r1; ++m)
      for (int64_t g = 0; g < G; ++g) {
        const float* xb = x + m * K + g * kBlock;
        float amax = 0.f, sum = 0.f;
        for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::abs(xb[i])), sum += xb[i];
        const float s = amax / 127.f, inv = s > 0.f ? 1.f / s : 0.f;
        xs[m * G + g] = s;
        xsum[m * G + g] = sum;
        for (int i = 0; i < kBlock; ++i) xq[m * K + position(g, G, i, pairs)] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
      }
  });
}

struct Quantized {
  at::Tensor xq, xs, xsum;
};

Quantized quantize(const at::Tensor& x, bool pairs) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "x must be a contiguous fp32 CPU tensor [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(M >= 1 && K % kBlock == 0 && K / kBlock <= qdot::kMaxGroups, "K must be a multiple of ", kBlock,
              " up to ", kBlock * qdot::kMaxGroups, ", got ", K);
  Quantized q{at::empty({M, K}, x.options().dtype(at::kChar)), at::empty({M, K / kBlock}, x.options()),
              at::empty({M, K / kBlock}, x.options())};
  quantize_rows(x.data_ptr<float>(), M, K, q.xq.data_ptr<int8_t>(), q.xs.data_ptr<float>(), q.xsum.data_ptr<float>(), pairs);
  return q;
}

constexpr int64_t kTile = 64;  // output channels a thread takes at a time: their weights stay in L2 across row blocks

// Every row block over every tile of output channels; threads take tiles from a shared counter (a
// thread that loses its core on a shared machine holds nothing back). Which thread computes a tile
// never changes its bits.
void run(const qdot::Args& a, int64_t M, qdot::RowsFn rows) {
  const int64_t tiles = (a.N + kTile - 1) / kTile;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(tiles, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t t = next.fetch_add(1); t < tiles; t = next.fetch_add(1)) {
      const int64_t n0 = t * kTile, n1 = std::min(a.N, n0 + kTile);
      for (int64_t m0 = 0; m0 < M; m0 += qdot::kMaxRows)
        rows(a, m0, static_cast<int>(std::min<int64_t>(qdot::kMaxRows, M - m0)), n0, n1);
    }
  });
}

at::Tensor qdot_int8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t isa) {
  auto fns = kernels(isa);
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "], got ", x.sizes());
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && w.dim() == 2, "w must be contiguous int8 [N, K]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N, "scale: fp32 [N]");
  Quantized q = quantize(x, false);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qdot::Args a{q.xq.data_ptr<int8_t>(), q.xs.data_ptr<float>(), q.xsum.data_ptr<float>(), K, N, w.data_ptr(),
               scale.data_ptr<float>(), nullptr, nullptr, y.data_ptr<float>()};
  run(a, x.size(0), fns.first);
  return y;
}

at::Tensor qdot_int4(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, const at::Tensor& offset,
                     int64_t isa) {
  auto fns = kernels(isa);
  const int64_t N = w.size(0), K = w.size(1) * 2, G = K / kBlock;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "], got ", x.sizes());
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.dim() == 2, "w must be contiguous uint8 [N, K/2]");
  for (const at::Tensor* t : {&scale, &offset})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->numel() == N * G,
                "scale and offset: fp16 [N, K/32]");
  Quantized q = quantize(x, true);
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  qdot::Args a{q.xq.data_ptr<int8_t>(), q.xs.data_ptr<float>(), q.xsum.data_ptr<float>(), K, N, w.data_ptr(), nullptr,
               reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>()),
               reinterpret_cast<const uint16_t*>(offset.data_ptr<at::Half>()), y.data_ptr<float>()};
  run(a, x.size(0), fns.second);
  return y;
}

// The weights back in fp32 [N, K], for a long prefill's fp32 GEMM (cpu_qdot.py: `dequantized`): int8,
// w * scale[n]; 4-bit, fma(q, scale, offset) per block (byte j of a block: q[j] low, q[j + 16] high).
at::Tensor qdot_dequantize(const at::Tensor& w, const at::Tensor& scale, const std::optional<at::Tensor>& offset) {
  const bool four = offset.has_value();
  const int64_t N = w.size(0), K = four ? w.size(1) * 2 : w.size(1), G = K / kBlock;
  TORCH_CHECK(w.is_contiguous() && w.scalar_type() == (four ? at::kByte : at::kChar) && K % kBlock == 0,
              "w: contiguous int8 [N, K] or 4-bit uint8 [N, K / 2], K a multiple of 32");
  TORCH_CHECK(scale.is_contiguous() && scale.numel() == (four ? N * G : N) &&
                  scale.scalar_type() == (four ? at::kHalf : at::kFloat) &&
                  (!four || (offset->is_contiguous() && offset->numel() == N * G && offset->scalar_type() == at::kHalf)),
              "scale: fp32 [N] (int8), or fp16 scale and offset [N, K / 32] (4-bit)");
  at::Tensor out = at::empty({N, K}, w.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* row = op + n * K;
      if (!four) {
        const int8_t* wr = w.data_ptr<int8_t>() + n * K;
        const __m256 s = _mm256_set1_ps(scale.data_ptr<float>()[n]);
        for (int64_t k = 0; k < K; k += 8)
          _mm256_storeu_ps(row + k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wr + k)))), s));
        continue;
      }
      const uint8_t* wr = w.data_ptr<uint8_t>() + n * (K / 2);
      const uint16_t* sr = reinterpret_cast<const uint16_t*>(scale.data_ptr<at::Half>()) + n * G;
      const uint16_t* orow = reinterpret_cast<const uint16_t*>(offset->data_ptr<at::Half>()) + n * G;
      for (int64_t g = 0; g < G; ++g) {
        const __m256 s = _mm256_set1_ps(_cvtsh_ss(sr[g])), o = _mm256_set1_ps(_cvtsh_ss(orow[g]));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + g * 16));
        const __m128i q[2] = {_mm_and_si128(b, _mm_set1_epi8(0x0F)), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F))};
        for (int h = 0; h < 2; ++h) {  // q[0..15], then q[16..31]
          float* at = row + g * kBlock + h * 16;
          _mm256_storeu_ps(at, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q[h])), s, o));
          _mm256_storeu_ps(at + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q[h], 8))), s, o));
        }
      }
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qdot_quantize(const at::Tensor& x) {
  Quantized q = quantize(x, false);
  return {q.xq, q.xs, q.xsum};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("qdot_isas() -> int", &supported_isas);  // no tensor to dispatch on: one kernel for every backend
  m.def("qdot_quantize(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("qdot_dequantize(Tensor w, Tensor scale, Tensor? offset) -> Tensor");
  m.def("qdot_int8(Tensor x, Tensor w, Tensor scale, int isa) -> Tensor");
  m.def("qdot_int4(Tensor x, Tensor w, Tensor scale, Tensor offset, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(latency_lab_gemv, CPU, m) {
  m.impl("qdot_quantize", &qdot_quantize);
  m.impl("qdot_dequantize", &qdot_dequantize);
  m.impl("qdot_int8", &qdot_int8);
  m.impl("qdot_int4", &qdot_int4);
}
