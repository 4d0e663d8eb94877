// Scalar reference kernels: the oracle every SIMD kernel is tested against.
#include "kernels/cpu/ref/ref.h"

#include "numerics/bf16.h"

namespace kvant::kernels::ref {

void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y,
               int64_t ldy, int64_t m, int64_t n0, int64_t n1) {
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* xi = x + i * ldx;
    for (int64_t j = n0; j < n1; ++j) {
      const uint16_t* wj = w + j * k;
      float acc = 0.f;
      for (int64_t p = 0; p < k; ++p) acc += bf16_to_f32(xi[p]) * bf16_to_f32(wj[p]);
      y[i * ldy + j] = acc;
    }
  }
}

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = kvant::f32_to_bf16(src[i]);
}

}  // namespace kvant::kernels::ref
