// BF16 <-> FP32. BF16 is the upper half of an IEEE binary32; conversion from
// FP32 rounds to nearest even and keeps NaNs quiet (never rounds a NaN to Inf).
#pragma once

#include <bit>
#include <cstdint>

namespace kvant {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace kvant
