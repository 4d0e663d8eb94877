// Thin wrappers over the kernel table (matrix products split over output rows
// in blocks of 64, so every thread streams its own slice of the weights) and
// the RoPE rotation, which is too small to need a kernel of its own.
#include "model/ops.h"

#include <cmath>

#include "core/threads.h"
#include "kernels/cpu/kernels.h"
#include "numerics/bf16.h"

namespace kvant::ops {

void matmul(const uint16_t* x, int64_t ldx, const Matrix& W, float* y, int64_t ldy, int64_t m) {
  const auto& K = kernels::active();
  parallel_for(W.rows, 64, [&](int64_t n0, int64_t n1) {
    K.gemm_bf16_packed(x, ldx, W.packed.data(), W.cols, y, ldy, m, n0, n1);
  });
}

void to_bf16(const float* x, int64_t ld, uint16_t* xb, int64_t ldb, int64_t rows, int64_t n) {
  const auto& K = kernels::active();
  for (int64_t r = 0; r < rows; ++r) K.f32_to_bf16(x + r * ld, xb + r * ldb, n);
}

void rmsnorm(const float* x, const float* w, float eps, float* out, int64_t n) {
  kernels::active().rmsnorm(x, w, 0.f, eps, out, n);
}

void rope(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t h = hd / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] - b * sin[i];
    x[i + h] = b * cos[i] + a * sin[i];
  }
}

}  // namespace kvant::ops

namespace kvant {

void Matrix::row_f32(int64_t r, float scale, float* out) const {
  // Inverse of the P16-pair packing for one row: element (r, 2q+e) sits at
  // ((panel * kp) + q) * 32 + 2 * (r % 16) + e.
  const int64_t kp = (cols + 1) / 2;
  const uint16_t* base = packed.data() + (r / kernels::kPackRows) * kp * 32 + 2 * (r % kernels::kPackRows);
  for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(base[(c / 2) * 32 + (c & 1)]) * scale;
}

}  // namespace kvant
