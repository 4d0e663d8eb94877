// Load-time packing of FP8 e4m3 weights into the F8 Q16 layout gemm_f8 reads
// (kernels.h), and the inverse for one element. Plain scalar code: it runs
// once per weight at load, never per token.
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "numerics/fp8.h"

namespace kvant::kernels {
namespace {

// Byte offset of (row, col) in a packed matrix.
int64_t f8_offset(int64_t k, int64_t group, int64_t row, int64_t col) {
  const int64_t g = col / group, c = col - g * group;
  return ((row / 16) * f8_quads(k, group) + g * f8_group_quads(k, group) + c / 4) * 64 +
         4 * (row % 16) + c % 4;
}

}  // namespace

float f8_subnormal_share(const uint8_t* codes, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += (codes[i] & 0x78) == 0 && (codes[i] & 0x07) != 0;
  return n > 0 ? float(double(c) / double(n)) : 0.f;
}

bool pack_f8(const uint8_t* codes, const float* scale, int64_t n, int64_t k, int64_t group,
             uint8_t* w, float* scales) {
  const int64_t panels = q4_panels(n), groups = f8_groups(k, group);
  std::memset(w, 0, size_t(f8_packed_bytes(n, k, group)));
  bool nan = false;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* cr = codes + j * k;
    for (int64_t c = 0; c < k; ++c) {
      w[f8_offset(k, group, j, c)] = cr[c];
      nan = nan || (cr[c] & 0x7f) == 0x7f;
    }
  }
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t j = p * 16 + r;
        scales[(p * groups + g) * 16 + r] = j < n ? scale[j * groups + g] : 0.f;
      }
  return nan;
}

float f8_weight(const F8Weights& W, int64_t row, int64_t col) {
  const uint8_t code = W.w[f8_offset(W.k, W.group, row, col)];
  const float s = W.scales[((row / 16) * f8_groups(W.k, W.group) + col / W.group) * 16 + row % 16];
  return fp8_e4m3_to_f32(code) * s;
}

}  // namespace kvant::kernels
