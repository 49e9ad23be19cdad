// Integer dot-product products for int8 and 4-bit weights: activations quantized to int8 per block of
// 32 on the fly (llama.cpp's Q8_0, ONNX Runtime's MatMulNBits accuracy level 4), weights multiplied as
// integers (vpmaddubsw/vpmaddwd on AVX2, vpdpbusd with AVX-512 VNNI or AVX-VNNI, AMX tiles for each 16
// rows: cpu_qdot_amx.cpp), one float FMA a block for 16 output channels side by side (cpu_qdot.h).
// engine/kernels/cpu_qdot.py picks the ISA from the detected capabilities and checks it.
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
#include <cmath>
#include <cstring>
#include <tuple>
#include <cpuid.h>
#include <immintrin.h>
#include <torch/library.h>

#include "cpu_qdot_ops.h"
#include "cpu_tiles.h"

namespace {

using qdot::kBlock;
using qdot::Quantized;

enum Isa : int64_t { kAvx2 = 1, kVnni512 = 2, kAvxVnni = 4, kVnni256 = 8, kAmx = 16 };  // cpu_qdot.py ISAS
// Added to a form's code: the row kernels leave the weights' stream to the hardware's prefetchers (Args::fetch
// false; cpu_qdot.py HARDWARE_STREAM; the plan's rule w8a_hardware_stream says where).
constexpr int64_t kHardwareStream = 32;

int64_t probe_isas() {  // cpuid, as the CPU that runs the code reports it (an emulator's, not /proc's)
  __builtin_cpu_init();
  int64_t mask = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) mask |= kAvx2;
  if ((mask & kAvx2) && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw"))
    mask |= kVnni512 | kVnni256;
  if ((mask & kAvx2) && __builtin_cpu_supports("avxvnni")) mask |= kAvxVnni;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // AMX-TILE and AMX-INT8: cpuid leaf 7, EDX bits 24 and 25
  const bool amx = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 24 & 1) && (edx >> 25 & 1);
  if ((mask & kVnni512) && amx && qdot::amx::enable()) mask |= kAmx;  // its rows past the tiles take vnni512
  return mask;
}

int64_t supported_isas() {  // probed once a process: a product asks every call
  static const int64_t mask = probe_isas();
  return mask;
}

std::pair<qdot::RowsFn, qdot::RowsFn> kernels(int64_t isa) {
  TORCH_CHECK(isa == kAvx2 || isa == kVnni512 || isa == kAvxVnni || isa == kVnni256 || isa == kAmx,
              "unknown integer-kernel ISA ", isa);
  TORCH_CHECK(supported_isas() & isa, "this CPU lacks the instructions of integer-kernel ISA ", isa);
  if (isa == kVnni512 || isa == kAmx) return {&qdot::vnni512::int8_rows, &qdot::vnni512::int4_rows};
  if (isa == kVnni256) return {&qdot::vnni256::int8_rows, &qdot::vnni256::int4_rows};
  if (isa == kAvxVnni) return {&qdot::avxvnni::int8_rows, &qdot::avxvnni::int4_rows};
  return {&qdot::avx2::int8_rows, &qdot::avx2::int4_rows};
}

constexpr int64_t kTile = 64;  // many rows: output channels a tile, their weights kept in L2 across row blocks

// A row of quantized activations from the interleaved layout (cpu_qdot.h) back in block order: G blocks
// of 8 4-byte steps.
void deinterleave(const uint8_t* src, uint8_t* dst, int64_t G) {
  for (int64_t c0 = 0; c0 < G; c0 += qdot::kChunk) {
    const int64_t lanes = std::min<int64_t>(qdot::kChunk, G - c0);
    const uint8_t* chunk = src + c0 * kBlock;
    for (int64_t s = 0; s < 8; ++s)
      for (int64_t i = 0; i < lanes; ++i) std::memcpy(dst + ((c0 + i) * 8 + s) * 4, chunk + (s * lanes + i) * 4, 4);
  }
}

static_assert(kTile == qdot::amx::kGroups * qdot::amx::kCols, "an AMX panel is a tile of channels");

// Every row block over every tile of output channels (cpu_tiles.h: who takes which, and how big). In the
// AMX form, the rows that fill 16-row tiles go through them (`tiled`: a panel's weights laid out once,
// in `scratch`, for all of them), the rest through the row kernels.
void run(const qdot::Args& a, int64_t M, qdot::RowsFn rows, int64_t isa, int64_t kind) {
  const int64_t tiled = isa == kAmx ? M / qdot::amx::kRows * qdot::amx::kRows : 0;
  int64_t tile = tiled ? kTile : tiles::size(a.N, M <= qdot::kMaxRows, kTile, 16);
  tile = (tile + qdot::kLanes - 1) / qdot::kLanes * qdot::kLanes;  // whole groups of channels
  at::Tensor xb, scratch;
  const int64_t panel = tiled ? qdot::amx::panel_bytes(a.K) : 0;
  if (tiled) {
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    xb = at::empty({tiled * a.K}, bytes);
    scratch = at::empty({(a.N + tile - 1) / tile * panel}, bytes);
    const uint8_t* from = reinterpret_cast<const uint8_t*>(a.xq);
    uint8_t* to = xb.data_ptr<uint8_t>();
    tiles::run(tiled / qdot::amx::kRows, [&](int64_t b) {  // the tiles read the activations in block order
      for (int64_t m = b * qdot::amx::kRows; m < (b + 1) * qdot::amx::kRows; ++m)
        deinterleave(from + m * a.kp, to + m * a.K, a.K / kBlock);
    });
  }
  tiles::run((a.N + tile - 1) / tile, [&](int64_t t) {
    const int64_t n0 = t * tile, n1 = std::min(a.N, n0 + tile);
    if (tiled) {
      const int8_t* from = reinterpret_cast<const int8_t*>(xb.data_ptr<uint8_t>());
      uint8_t* mine = scratch.data_ptr<uint8_t>() + t * panel;
      (kind == 1 ? qdot::amx::int8_tiles : qdot::amx::int4_tiles)(a, from, tiled, n0, n1, mine);
    }
    for (int64_t m0 = tiled; m0 < M; m0 += qdot::kMaxRows)
      rows(a, m0, static_cast<int>(std::min<int64_t>(qdot::kMaxRows, M - m0)), n0, n1);
  });
}

at::Tensor qdot_int8(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous fp32 CPU tensor [M, K]");
  const at::Tensor ws[] = {w, scale};
  return qdot::product(qdot::quantize(x, true), ws, 1, isa, at::Tensor(), at::Tensor());
}

at::Tensor qdot_int4(const at::Tensor& x, const at::Tensor& w, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous fp32 CPU tensor [M, K]");
  return qdot::product(qdot::quantize(x, true), &w, 2, isa, at::Tensor(), at::Tensor());
}

// The weights back in fp32 [N, K], for a long prefill's fp32 GEMM (cpu_qdot.py: `dequantized`), from
// their groups (cpu_qdot.h): int8 (`scale` given), w * scale[n]; 4-bit, fma(q, scale, offset) per block.
at::Tensor qdot_dequantize(const at::Tensor& w, const std::optional<at::Tensor>& scale) {
  const bool four = !scale.has_value();
  const int64_t N = w.size(0), K = four ? w.size(1) * 8 / 5 : w.size(1), G = K / kBlock;
  TORCH_CHECK(w.is_contiguous() && w.dim() == 2 && w.scalar_type() == (four ? at::kByte : at::kChar) &&
                  K % kBlock == 0 && (!four || w.size(1) == K / 2 + 4 * G),
              "w: contiguous int8 [N, K] with fp32 scales [N], or 4-bit groups [N, K / 2 + K / 8], K a multiple of 32");
  TORCH_CHECK(four || (scale->is_contiguous() && scale->numel() == N && scale->scalar_type() == at::kFloat),
              "scale: fp32 [N]");
  at::Tensor out = at::empty({N, K}, w.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  const uint8_t* base = static_cast<const uint8_t*>(w.data_ptr());
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* row = op + n * K;
      // channel n: lane l of the group at c0, whose R channels' blocks are records of R lanes (cpu_qdot.h)
      const int64_t c0 = n / qdot::kLanes * qdot::kLanes, R = std::min<int64_t>(qdot::kLanes, N - c0), l = n - c0;
      const uint8_t* group = base + c0 * w.size(1);
      if (!four) {
        const __m256 s = _mm256_set1_ps(scale->data_ptr<float>()[n]);
        for (int64_t g = 0; g < G; ++g) {
          alignas(32) int8_t bytes[kBlock];  // the block's weights in order
          for (int j = 0; j < 8; ++j) std::memcpy(bytes + 4 * j, group + g * kBlock * R + 4 * R * j + 4 * l, 4);
          for (int64_t k = 0; k < kBlock; k += 8)
            _mm256_storeu_ps(row + g * kBlock + k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + k)))), s));
        }
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* rec = group + g * qdot::kBlock4 * R;
        const uint16_t* sr = reinterpret_cast<const uint16_t*>(rec + 16 * R);  // the scales, then the offsets
        const __m256 s = _mm256_set1_ps(_cvtsh_ss(sr[l])), o = _mm256_set1_ps(_cvtsh_ss(sr[R + l]));
        alignas(16) uint8_t bytes[16];  // the block's bytes in order: byte j holds q[j] low, q[j + 16] high
        for (int j = 0; j < 4; ++j) std::memcpy(bytes + 4 * j, rec + 4 * R * j + 4 * l, 4);
        const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes));
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

// x quantized, in block order: (xq [M, K] int8, scale [M, G], block sums [M, G]), for the tests.
std::tuple<at::Tensor, at::Tensor, at::Tensor> qdot_quantize(const at::Tensor& x) {
  const Quantized q = qdot::quantize(x, false);
  const int64_t M = x.size(0), K = x.size(1), G = K / kBlock, base = M * K;
  return {q.buf.narrow(0, 0, base).view(at::kChar).view({M, K}),
          q.buf.narrow(0, base, 4 * M * G).view(at::kFloat).view({M, G}),
          q.buf.narrow(0, base + 4 * M * G, 4 * M * G).view(at::kFloat).view({M, G})};
}

}  // namespace

at::Tensor qdot::product(const Quantized& q, const at::Tensor* weights, int64_t kind, int64_t isa,
                         const at::Tensor& bias, const at::Tensor& residual, const at::Tensor& into) {
  TORCH_CHECK(kind == 1 || kind == 2, "integer kernels: kind 1 (int8) or 2 (4-bit)");
  TORCH_CHECK(q.L.interleaved, "the kernels read interleaved activations");
  const bool fetch = !(isa & kHardwareStream);
  isa &= ~kHardwareStream;
  auto fns = kernels(isa);
  const at::Tensor& w = weights[0];
  const int64_t N = w.size(0), K = q.L.K, G = K / kBlock, M = q.rows;
  qdot::Args a{q.xq(), q.xs(), q.xsum(), q.xqs(), K, N, q.L.kp, q.L.gp, w.data_ptr(), nullptr, nullptr, nullptr, nullptr, fetch};
  if (kind == 1) {
    TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && w.dim() == 2 && w.size(1) == K,
                "w must be contiguous int8 [N, ", K, "]");
    const at::Tensor& scale = weights[1];
    TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N, "scale: fp32 [N]");
    a.scale8 = scale.data_ptr<float>();
  } else {
    TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.dim() == 2 && w.size(1) == K / 2 + 4 * G,
                "w must be contiguous uint8 groups [N, ", K / 2 + 4 * G, "]: 4-bit weights, fp16 scales and offsets");
  }
  at::Tensor y = into;
  if (y.defined()) {
    TORCH_CHECK(y.scalar_type() == at::kFloat && y.is_contiguous() && y.numel() == M * N, "y: contiguous fp32 [M, N]");
  } else {
    y = at::empty({M, N}, q.buf.options().dtype(at::kFloat));
  }
  a.y = y.data_ptr<float>();
  if (bias.defined()) {
    TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.numel() == N, "bias: fp32 [N]");
    a.bias = bias.data_ptr<float>();
  }
  if (residual.defined()) {
    TORCH_CHECK(residual.scalar_type() == at::kFloat && residual.is_contiguous() && residual.numel() == M * N,
                "residual: contiguous fp32 [M, N]");
    a.resid = residual.data_ptr<float>();
  }
  run(a, M, kind == 1 ? fns.first : fns.second, isa, kind);
  return y;
}

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("qdot_isas() -> int", &supported_isas);  // no tensor to dispatch on: one kernel for every backend
  m.def("qdot_quantize(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("qdot_dequantize(Tensor w, Tensor? scale) -> Tensor");
  m.def("qdot_int8(Tensor x, Tensor w, Tensor scale, int isa) -> Tensor");
  m.def("qdot_int4(Tensor x, Tensor w, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(latency_lab_gemv, CPU, m) {
  m.impl("qdot_quantize", &qdot_quantize);
  m.impl("qdot_dequantize", &qdot_dequantize);
  m.impl("qdot_int8", &qdot_int8);
  m.impl("qdot_int4", &qdot_int4);
}
