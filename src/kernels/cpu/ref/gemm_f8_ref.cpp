// Scalar reference FP8-weight GEMM: the oracle every SIMD gemm_f8 is tested
// against. Codes decode exactly (numerics/fp8.h); a BF16 x e4m3 product is
// exact in FP32, so only the additions and the per-group scaling round. Even
// and odd columns are summed apart, as the SIMD kernels do.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ref/ref.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant::kernels::ref {

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& W, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  const float* dec = fp8_e4m3_table();
  const int64_t groups = f8_groups(W.k, W.group), gq = f8_group_quads(W.k, W.group);
  const int64_t kq = f8_quads(W.k, W.group);
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t* xi = x + i * ldx;
    for (int64_t j = n0; j < n1; ++j) {
      const float* sc = W.scales + (j / 16) * groups * 16 + j % 16;
      float out = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* pw = W.w + ((j / 16) * kq + g * gq) * 64 + 4 * (j % 16);
        float acc[2] = {0.f, 0.f};  // even and odd columns
        const int64_t c0 = g * W.group, c1 = std::min(W.k, c0 + W.group);
        for (int64_t c = c0; c < c1; ++c)
          acc[c & 1] += kvant::bf16_to_f32(xi[c]) * dec[pw[((c - c0) / 4) * 64 + (c - c0) % 4]];
        out = std::fma(acc[0] + acc[1], sc[g * 16], out);
      }
      y[i * ldy + j] = out;
    }
  }
}

}  // namespace kvant::kernels::ref
