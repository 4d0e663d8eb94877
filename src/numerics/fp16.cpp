// FP32 -> FP16 with round-to-nearest-even, subnormals, Inf and quiet NaN.
#include "numerics/fp16.h"

namespace kvant {

uint16_t f32_to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN stays NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {               // below the smallest normal 2^-14: subnormal or zero
    if (a < 0x33000000u) return sign;  // < 2^-25 rounds to zero (2^-25 itself ties to 0)
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // value = m * 2^(e-150); want units of 2^-24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t r = a - 0x38000000u;  // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

}  // namespace kvant
