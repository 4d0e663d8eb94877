// IEEE binary16 <-> FP32 in portable code (the baseline ISA has no F16C).
// FP32 -> FP16 rounds to nearest even; overflow goes to Inf as IEEE says
// (FP16 is a storage format for weights here, not a saturating KV format).
// NaNs: widening keeps the payload bit for bit; narrowing keeps the sign and
// top 10 payload bits and sets the quiet bit, exactly like F16C's vcvtps2ph.
// Scalar only: vectorised conversions belong to kernels/ (tested against
// these). Layout and rules: docs/FORMATS.md.
#pragma once

#include <bit>
#include <cstdint>

namespace kvant {

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  // Subnormal (or zero): man * 2^-24, exact in FP32.
  float v = float(man) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

uint16_t f32_to_fp16(float f);

}  // namespace kvant
