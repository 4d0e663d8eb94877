// Scalar reference GEMMs and the weight packer: the oracle every SIMD GEMM is
// tested against. The sum for one (i, j) runs sequentially over k; BF16 x BF16
// products are exact in FP32, so only the additions round.
#include <algorithm>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ref/ref.h"
#include "numerics/bf16.h"

namespace kvant::kernels::ref {

void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy,
               int64_t m, int64_t n0, int64_t n1) {
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* xi = x + i * ldx;
    for (int64_t j = n0; j < n1; ++j) {
      const uint16_t* wj = w + j * k;
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc += kvant::bf16_to_f32(xi[p]) * kvant::bf16_to_f32(wj[p]);
      y[i * ldy + j] = acc;
    }
  }
}

void gemm_bf16_packed(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                      int64_t ldy, int64_t m, int64_t n0, int64_t n1) {
  const int64_t kp = (k + 1) / 2;
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* xi = x + i * ldx;
    for (int64_t j = n0; j < n1; ++j) {
      const uint16_t* panel = wp + (j / kPackRows) * kp * 2 * kPackRows;
      const int64_t r = j % kPackRows;
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) {
        const uint16_t wv = panel[(p / 2) * 2 * kPackRows + 2 * r + (p % 2)];
        acc += kvant::bf16_to_f32(xi[p]) * kvant::bf16_to_f32(wv);
      }
      y[i * ldy + j] = acc;
    }
  }
}

void pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* wp) {
  const int64_t kp = (k + 1) / 2;
  const int64_t panels = (n + kPackRows - 1) / kPackRows;
  std::fill(wp, wp + gemm_bf16_packed_size(n, k), uint16_t(0));
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* panel = wp + p * kp * 2 * kPackRows;
    const int64_t rows = std::min(kPackRows, n - p * kPackRows);
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* wj = w + (p * kPackRows + r) * k;
      for (int64_t c = 0; c < k; ++c) panel[(c / 2) * 2 * kPackRows + 2 * r + (c % 2)] = wj[c];
    }
  }
}

}  // namespace kvant::kernels::ref
