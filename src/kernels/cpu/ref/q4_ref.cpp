// Scalar reference for INT4 x int8 products (kernels.h, gemm_q4 and
// quantize_q8): reads the Q4 P16 layout element by element, in the order the
// contract states, so the SIMD kernels can be checked bit for bit.
#include <cmath>
#include <cstdlib>

#include "kernels/cpu/ref/ref.h"
#include "numerics/bf16.h"

namespace kvant::kernels::ref {

void quantize_q8(const float* x, int64_t k, int8_t* q, float* s, int32_t* sum) {
  for (int64_t b = 0; b < k / kQ4Block; ++b) {
    const float* xb = x + b * kQ4Block;
    float amax = 0.f;
    for (int i = 0; i < kQ4Block; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    int32_t total = 0;
    if (amax == 0.f) {
      for (int i = 0; i < kQ4Block; ++i) q[b * kQ4Block + i] = 0;
      s[b] = 0.f;
    } else {
      const float id = 127.f / amax;
      for (int i = 0; i < kQ4Block; ++i) {
        const auto a = int8_t(std::nearbyint(xb[i] * id));
        q[b * kQ4Block + i] = a;
        total += a;
      }
      s[b] = amax / 127.f;
    }
    sum[b] = total;
  }
}

void gemm_q4(const Q8Rows& x, const Q4Weights& W, float* y, int64_t ldy, int64_t m, int64_t n0,
             int64_t n1) {
  const int64_t groups = q4_groups(W.k, W.group), bpg = W.group / kQ4Block, nblk = W.k / kQ4Block;
  for (int64_t i = 0; i < m; ++i) {
    const int8_t* a = x.q + i * x.ldq;
    const float* sa = x.s + i * x.lds;
    const int32_t* asum = x.sum + i * x.lds;
    for (int64_t j = n0; j < n1; ++j) {
      const int64_t p = j / 16, r = j % 16;
      const uint8_t* pw = W.w + p * W.k * 8;
      float yj = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = (p * groups + g) * 16 + r;
        const int32_t o = W.offs ? W.offs[at] : 8;
        float acc = 0.f;
        for (int64_t bb = 0; bb < bpg && g * bpg + bb < nblk; ++bb) {
          const int64_t b = g * bpg + bb;
          int32_t isum = 0;
          for (int64_t c = 0; c < 4; ++c)
            for (int64_t e = 0; e < 4; ++e) {
              const uint8_t byte = pw[b * 256 + c * 64 + r * 4 + e];
              isum += int32_t(byte & 15) * a[b * 32 + c * 8 + e];
              isum += int32_t(byte >> 4) * a[b * 32 + c * 8 + 4 + e];
            }
          acc = std::fma(float(isum - o * asum[b]), sa[b], acc);
        }
        yj = std::fma(acc, kvant::bf16_to_f32(W.scales[at]), yj);
      }
      y[i * ldy + j] = yj;
    }
  }
}

}  // namespace kvant::kernels::ref
