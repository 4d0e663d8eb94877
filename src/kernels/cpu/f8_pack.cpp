// Load-time packing of FP8 e4m3 weights into the F8 P16 layout gemm_f8 reads
// (kernels.h), and the inverse for one element. Plain scalar code: it runs
// once per weight at load, never per token.
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "numerics/fp8.h"

namespace kvant::kernels {

bool pack_f8(const uint8_t* codes, const float* scale, int64_t n, int64_t k, int64_t group,
             uint8_t* w, float* scales) {
  const int64_t panels = q4_panels(n), groups = f8_groups(k, group), kp = k / 2;
  std::memset(w, 0, size_t(f8_packed_bytes(n, k)));
  bool nan = false;
  for (int64_t p = 0; p < panels; ++p) {
    uint8_t* pw = w + p * kp * 32;
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t j = p * 16 + r;
      if (j >= n) continue;
      const uint8_t* cr = codes + j * k;
      for (int64_t c = 0; c < k; ++c) {
        pw[(c / 2) * 32 + 2 * r + (c & 1)] = cr[c];
        nan = nan || (cr[c] & 0x7f) == 0x7f;
      }
    }
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t j = p * 16 + r;
        scales[(p * groups + g) * 16 + r] = j < n ? scale[j * groups + g] : 0.f;
      }
  }
  return nan;
}

float f8_weight(const F8Weights& W, int64_t row, int64_t col) {
  const int64_t p = row / 16, r = row % 16, kp = W.k / 2;
  const uint8_t code = W.w[(p * kp + col / 2) * 32 + 2 * r + (col & 1)];
  const float s = W.scales[(p * f8_groups(W.k, W.group) + col / W.group) * 16 + r];
  return fp8_e4m3_to_f32(code) * s;
}

}  // namespace kvant::kernels
