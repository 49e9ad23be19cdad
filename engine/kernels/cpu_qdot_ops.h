// The integer kernels' ATen-level pieces, shared by their ops (cpu_qdot.cpp), the quantizer
// (cpu_qdot_quant.cpp), the fused projections (cpu_fused.cpp) and the C++ layer loop (cpu_layers.cpp).
// Not included by the per-ISA files (cpu_qdot.h says why).
#pragma once
#include <ATen/core/Tensor.h>

#include "cpu_qdot.h"

namespace qdot {

struct Layout {  // the quantized activations' strides: in block order, or the kernels' interleaved layout
  int64_t K, G, kp, gp;
  bool interleaved;
  Layout(int64_t k, bool il)
      : K(k), G(k / kBlock), kp(il ? (k / kBlock + kChunk - 1) / kChunk * kChunk * kBlock : k),
        gp(il ? kp / kBlock : k / kBlock), interleaved(il) {}
};

struct Quantized {  // one allocation: xq [rows, kp], then xs, xsum [rows, gp] fp32, xqs [rows, gp] int32
  at::Tensor buf;
  Layout L;
  int64_t rows;
  static int64_t bytes(const Layout& L) { return L.kp + 12 * L.gp; }
  int8_t* xq() const { return reinterpret_cast<int8_t*>(buf.data_ptr<uint8_t>()); }
  float* xs() const { return reinterpret_cast<float*>(buf.data_ptr<uint8_t>() + rows * L.kp); }
  float* xsum() const { return xs() + rows * L.gp; }
  int32_t* xqs() const { return reinterpret_cast<int32_t*>(xsum() + rows * L.gp); }
};

// A projection's temporaries, kept by a caller that runs many (cpu_layers.cpp: one set a forward, for
// every projection of every layer), so that a one-row step allocates nothing per projection. Each one
// undefined (or no Scratch at all) is allocated where it is needed.
struct Scratch {
  at::Tensor bytes;    // the quantized activations: uint8, at least M * Quantized::bytes(Layout(K, true))
  at::Tensor squares;  // the norm's x * x: fp32 [M, K] (the norm's K)
  at::Tensor gated;    // silu(gate): fp32 [M, K] (the gated projection's K), where at::silu serves
};

// Rows of activations quantized per block of 32 (cpu_qdot_quant.cpp), into s->bytes where given, from
Quantized quantize(const at::Tensor& x, bool interleaved, const Scratch* s = nullptr);  // x [M, K] fp32 itself;
// rms_norm(x, weight, eps) as torch computes it in fp32 (x * rsqrt(mean(x^2) + eps), then * weight;
// the mean from torch's own sum), without the normalized rows in memory;
Quantized quantize_normed(const at::Tensor& x, const at::Tensor& weight, double eps, const Scratch* s = nullptr);
// a * b elementwise (silu(gate) * up: a, b [M, K], rows may be strided), without the product in memory.
Quantized quantize_product(const at::Tensor& a, const at::Tensor& b, const Scratch* s = nullptr);
// silu(gate) * up elementwise (torch's silu: its bits), without either in memory where this process's torch
// computes silu as cpu_qdot_quant.cpp does (else through at::silu, into s->gated where kept).
Quantized quantize_gated(const at::Tensor& gate, const at::Tensor& up, const Scratch* s = nullptr);
// Whether quantize_gated makes silu itself here (a probe against at::silu, once a process): else it needs s->gated.
bool silu_matches();

// y [M, N] = the quantized rows times a projection's weights: kind 1, {int8 [N, K], fp32 scale [N]};
// kind 2, {4-bit rows [N, K / 2 + K / 8]: weights, fp16 scales, fp16 offsets} (cpu_qdot.h), in form `isa`
// (cpu_qdot.py ISAS). Then `bias` [N] and `residual` [M, N] (fp32, or undefined) are added in that
// order, each add one rounding as torch's: y = residual + (product + bias). Written into `y` (contiguous
// fp32 [M, N]; it may be `residual` itself: each element is read before it is written) where defined.
at::Tensor product(const Quantized& q, const at::Tensor* weights, int64_t kind, int64_t isa, const at::Tensor& bias,
                   const at::Tensor& residual, const at::Tensor& y = at::Tensor());

// The fused projection of cpu_fused.cpp (its op qdot_project says what it computes).
at::Tensor project(const at::Tensor& x, const std::optional<at::Tensor>& norm_weight, double eps,
                   const std::optional<at::Tensor>& up, at::TensorList weights, int64_t kind, int64_t isa,
                   const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual);
// The same into `y` (product's), its temporaries in `s`: norm_weight, up, bias, residual null or undefined where none.
at::Tensor project_into(const at::Tensor& x, const at::Tensor* norm_weight, double eps, const at::Tensor* up,
                        const at::Tensor* weights, int64_t kind, int64_t isa, const at::Tensor& bias,
                        const at::Tensor& residual, const Scratch* s, const at::Tensor& y);

// q and k of a fused q/k/v output with rotary positions applied (cpu_fused.cpp: rope_qk), [R, H + KV, D]:
// into `out` (contiguous fp32 [R, H + KV, D]) where defined.
at::Tensor rope_qk(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t H, int64_t KV,
                   int64_t D, const at::Tensor& out = at::Tensor());

}  // namespace qdot
