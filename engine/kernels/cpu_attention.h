// Decode attention (cpu_attention.cpp), for C++ callers (the layer loop, cpu_layers.cpp): the function its ops
// decode_attention and decode_attention_kv run, called directly (no dispatcher look-up, no op boxing) and
// written into `out` (contiguous fp32 [sequences, H, D]) where defined. The caches' dtype picks the form:
// fp32, fp16, bf16, or int8 with k_scales and v_scales (empty lists for the others).
#pragma once
#include <ATen/core/Tensor.h>

namespace attention {

at::Tensor decode(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, at::TensorList k_caches,
                  at::TensorList v_caches, at::TensorList k_scales, at::TensorList v_scales, at::IntArrayRef rows,
                  at::IntArrayRef positions, int64_t layer, double scale, const at::Tensor& out = at::Tensor());

// Rows of keys or values x (fp32 [A, B, n, D], any strides, D contiguous) into an int8 cache's rows q (int8
// [A, B, n, D], D contiguous) and their scales (fp32 [A, B, n]), by the rule the decode rows are stored with
// (engine/model/kv_cache.py quantize_int8: the one int8 rule; the first-use check holds this code to it): the
// layer loop stores a prompt's rows so.
void store_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scales);

}  // namespace attention
