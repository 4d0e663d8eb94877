// Load-time packing of W4A16 weights into the Q4 P16 layout gemm_q4 reads
// (kernels.h), and the inverse for one element. Plain scalar code: it runs
// once per weight at load, never per token.
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "numerics/bf16.h"

namespace kvant::kernels {

void pack_q4(const int8_t* q, const float* scale, const int8_t* zero, int64_t n, int64_t k,
             int64_t group, uint8_t* w, uint16_t* scales, uint8_t* offs) {
  const int64_t panels = q4_panels(n), groups = q4_groups(k, group), blocks = k / kQ4Block;
  std::memset(w, 0, size_t(panels * k * 8));
  for (int64_t p = 0; p < panels; ++p) {
    uint8_t* pw = w + p * k * 8;
    for (int64_t r = 0; r < 16; ++r) {
      const int64_t j = p * 16 + r;
      if (j >= n) continue;
      const int8_t* qr = q + j * k;
      for (int64_t b = 0; b < blocks; ++b)
        for (int64_t c = 0; c < 4; ++c)
          for (int64_t i = 0; i < 4; ++i) {
            const int64_t col = b * 32 + c * 8 + i;
            const auto lo = uint8_t(qr[col] + 8), hi = uint8_t(qr[col + 4] + 8);
            pw[b * 256 + c * 64 + r * 4 + i] = uint8_t(lo | (hi << 4));
          }
    }
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t j = p * 16 + r, at = (p * groups + g) * 16 + r;
        scales[at] = j < n ? f32_to_bf16(scale[j * groups + g]) : 0;
        if (offs) offs[at] = j < n && zero ? uint8_t(8 + zero[j * groups + g]) : 8;
      }
  }
}

float q4_weight(const Q4Weights& W, int64_t row, int64_t col) {
  const int64_t p = row / 16, r = row % 16, b = col / 32, c = (col % 32) / 8, i = col % 8;
  const uint8_t byte = W.w[p * W.k * 8 + b * 256 + c * 64 + r * 4 + (i & 3)];
  const int u = i < 4 ? (byte & 15) : (byte >> 4);
  const int64_t at = (p * q4_groups(W.k, W.group) + col / W.group) * 16 + r;
  const int o = W.offs ? W.offs[at] : 8;
  return float(u - o) * bf16_to_f32(W.scales[at]);
}

}  // namespace kvant::kernels
