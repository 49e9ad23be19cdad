// A decoder layer's small ops fused into its projections (the C++ layer loop, cpu_layers.cpp, calls
// these; so can the Python loop, through the ops): each gives the very bits of the unfused torch ops
// it replaces, which the layers' Python loop runs (tests/test_cpu_fused.py holds them to it), without
// their ~10-20 op calls, temporaries and passes over memory a projection.
//
// qdot_project(x, norm_weight, eps, up, weights, kind, isa, bias, residual): one w8a projection
// (engine/quant/w8a.py) from what the layer has in hand:
//   rms_norm(x, norm_weight, eps) @ W   (q/k/v, gate/up: the norm and the int8 quantization in one pass)
//   (silu(x) * up) @ W                  (down: x the gate half, silu with torch's bits, quantized on the way)
//   x @ W                               (o)
// then + bias, then + residual (each one rounding, as torch's adds).
// rope_qk(qkv, cos, sin, H, KV, D): rotary positions on the q and k heads of a fused q/k/v output,
// x * cos + rotate_half(x) * sin with each product rounded (no FMA), as torch computes it.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <immintrin.h>
#include <torch/library.h>

#include "cpu_qdot_ops.h"

namespace qdot {
namespace {
inline __m256 rounded(__m256 v) {  // the product as torch leaves it in memory: no FMA across this
  asm("" : "+x"(v));
  return v;
}
}  // namespace

at::Tensor project_into(const at::Tensor& x, const at::Tensor* norm_weight, double eps, const at::Tensor* up,
                        const at::Tensor* weights, int64_t kind, int64_t isa, const at::Tensor& bias,
                        const at::Tensor& residual, const Scratch* s, const at::Tensor& y) {
  TORCH_CHECK(!(norm_weight && up), "a norm or a product, not both");
  Quantized q = norm_weight ? quantize_normed(x, *norm_weight, eps, s)
                : up        ? quantize_gated(x, *up, s)
                            : quantize(x, true, s);
  return product(q, weights, kind, isa, bias, residual, y);
}

at::Tensor project(const at::Tensor& x, const std::optional<at::Tensor>& norm_weight, double eps,
                   const std::optional<at::Tensor>& up, at::TensorList weights, int64_t kind, int64_t isa,
                   const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == (kind == 1 ? 2 : 1), "kind 1: int8 weights and scale; "
              "kind 2: 4-bit groups (weights, scales and offsets)");
  return project_into(x, norm_weight ? &*norm_weight : nullptr, eps, up ? &*up : nullptr, weights.data(), kind, isa,
                      bias.value_or(at::Tensor()), residual.value_or(at::Tensor()), nullptr, at::Tensor());
}

at::Tensor rope_qk(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t H, int64_t KV,
                   int64_t D, const at::Tensor& into) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && qkv.scalar_type() == at::kFloat && qkv.size(1) >= (H + KV) * D,
              "qkv: fp32 rows [R, >= (H + KV) * D], each contiguous");
  const int64_t R = qkv.size(0), half = D / 2;
  TORCH_CHECK(D % 16 == 0, "head_dim must be a multiple of 16");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == R && t->size(1) == D && t->stride(1) == 1 && t->scalar_type() == at::kFloat,
                "cos and sin: fp32 rows [R, D]");
  at::Tensor out = into;
  if (out.defined()) {
    TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == R * (H + KV) * D,
                "out: contiguous fp32 [R, H + KV, D]");
  } else {
    out = at::empty({R, H + KV, D}, qkv.options());
  }
  const float *xp = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const __m256 sign = _mm256_set1_ps(-0.f);
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *c = cp + r * cos.stride(0), *s = sp + r * sin.stride(0);
      for (int64_t h = 0; h < H + KV; ++h) {
        const float* x = xp + r * qkv.stride(0) + h * D;
        float* o = op + (r * (H + KV) + h) * D;
        for (int64_t d = 0; d < D; d += 8) {  // rotate_half: [-x[half:], x[:half]]
          const __m256 rot = d < half ? _mm256_xor_ps(_mm256_loadu_ps(x + d + half), sign) : _mm256_loadu_ps(x + d - half);
          const __m256 a = rounded(_mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(c + d)));
          const __m256 b = rounded(_mm256_mul_ps(rot, _mm256_loadu_ps(s + d)));
          _mm256_storeu_ps(o + d, _mm256_add_ps(a, b));
        }
      }
    }
  });
  return out;
}

namespace {
at::Tensor rope_qk_op(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t H, int64_t KV,
                      int64_t D) {
  return rope_qk(qkv, cos, sin, H, KV, D);
}
}  // namespace

}  // namespace qdot

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("qdot_project(Tensor x, Tensor? norm_weight, float eps, Tensor? up, Tensor[] weights, int kind, int isa, "
        "Tensor? bias, Tensor? residual) -> Tensor");
  m.def("rope_qk(Tensor qkv, Tensor cos, Tensor sin, int H, int KV, int D) -> Tensor");
}

TORCH_LIBRARY_IMPL(latency_lab_gemv, CPU, m) {
  m.impl("qdot_project", &qdot::project);
  m.impl("rope_qk", &qdot::rope_qk_op);
}
