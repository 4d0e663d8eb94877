// Row operations in plain C++ (compiled for the baseline ISA); the matrix
// products go through the kernel table, split over output rows in blocks of
// 64 so every thread streams its own slice of the weights.
#include "model/ops.h"

#include <cmath>

#include "core/threads.h"
#include "kernels/cpu/kernels.h"

namespace kvant::ops {

void matmul(const uint16_t* x, int64_t ldx, const Matrix& W, float* y, int64_t ldy, int64_t m) {
  const auto& K = kernels::active();
  parallel_for(W.rows, 64, [&](int64_t n0, int64_t n1) {
    K.gemm_bf16(x, ldx, W.data.data(), W.cols, y, ldy, m, n0, n1);
  });
}

void to_bf16(const float* x, int64_t ld, uint16_t* xb, int64_t ldb, int64_t rows, int64_t n) {
  const auto& K = kernels::active();
  for (int64_t r = 0; r < rows; ++r) K.f32_to_bf16(x + r * ld, xb + r * ldb, n);
}

void rmsnorm(const float* x, const float* w, float eps, float* out, int64_t n) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
}

void rope(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t h = hd / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] - b * sin[i];
    x[i + h] = b * cos[i] + a * sin[i];
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
  }
}

}  // namespace kvant::ops
