// Small elementwise and row operations of the forward pass (norms, RoPE,
// activations, matrix products through the kernel table). Stateless.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace kvant::ops {

// y[m, W.rows] = x[m, W.cols] (BF16, row stride ldx) @ W^T, split across threads.
void matmul(const uint16_t* x, int64_t ldx, const Matrix& W, float* y, int64_t ldy, int64_t m);
// Rows of x (FP32, stride ld) -> BF16 rows (stride ldb), n values each.
void to_bf16(const float* x, int64_t ld, uint16_t* xb, int64_t ldb, int64_t rows, int64_t n);
// out = x * rsqrt(mean(x^2) + eps) * w, one row of n.
void rmsnorm(const float* x, const float* w, float eps, float* out, int64_t n);
// Half-split (NeoX) rotation of one head of length hd with cos/sin [hd/2].
void rope(float* x, const float* cos, const float* sin, int64_t hd);

}  // namespace kvant::ops
