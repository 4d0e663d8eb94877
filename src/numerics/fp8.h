// FP8 formats (OCP): e4m3fn (bias 7, no Inf, NaN = S.1111.111, max 448) and
// e5m2 (bias 15, IEEE-like with Inf/NaN, max 57344). Decoding is a 256-entry
// table; encoding rounds to nearest even and saturates to the largest finite
// value (NaN stays NaN). Layout and rules: docs/FORMATS.md.
#pragma once

#include <cstdint>

namespace kvant {

float fp8_e4m3_to_f32(uint8_t v);
float fp8_e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);
uint8_t f32_to_fp8_e5m2(float f);
// Decode tables, for kernels that gather instead of computing.
const float* fp8_e4m3_table();
const float* fp8_e5m2_table();

}  // namespace kvant
