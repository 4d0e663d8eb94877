// FP8 formats (OCP): e4m3fn (bias 7, no Inf, NaN = S.1111.111, max 448) and
// e5m2 (bias 15, IEEE-like with Inf/NaN, max 57344). Decoding is a 256-entry
// table; encoding rounds to nearest even and saturates to the largest finite
// value (NaN stays NaN). Layout and rules: docs/FORMATS.md.
//
// Owns the scalar conversions and plain (unscaled) row converters; these are
// the oracle that SIMD/CUDA kernels are tested against. It does not own
// scaling: KV-cache and weight scales are applied by the caller (x / scale
// before encoding, value * scale after decoding).
#pragma once

#include <cstdint>
#include <span>

namespace kvant {

// Largest finite magnitudes; finite overflow and +-Inf encode to these.
inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr float kFp8E5m2Max = 57344.0f;
// Codes produced when encoding a NaN (the input's sign bit is kept: 0x80 | code
// for a negative NaN). e4m3fn has only one NaN per sign; for e5m2 this is the
// "quiet" pattern (top mantissa bit set), as IEEE quiets NaNs.
inline constexpr uint8_t kFp8E4m3NaN = 0x7f;
inline constexpr uint8_t kFp8E5m2NaN = 0x7e;
inline constexpr uint8_t kFp8E4m3MaxCode = 0x7e;  // 0.1111.110 = 448
inline constexpr uint8_t kFp8E5m2MaxCode = 0x7b;  // 0.11110.11 = 57344

// Decoding is exact. Every NaN code decodes to the FP32 default quiet NaN
// 0x7fc00000 with the code's sign; e5m2 0x7c/0xfc decode to +-Inf.
float fp8_e4m3_to_f32(uint8_t v);
float fp8_e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float f);
uint8_t f32_to_fp8_e5m2(float f);
// Decode tables, for kernels that gather instead of computing.
const float* fp8_e4m3_table();
const float* fp8_e5m2_table();

// Per-row scale for scaled FP8 storage (code = fp8(x / scale)): amax over the
// row's finite entries / max_finite, rounded up to the next BF16 value (so it
// can be stored in 2 bytes and amax / scale never exceeds max_finite), never
// below FLT_MIN. 1 for a row with no finite non-zero entry or max_finite 0.
// The one rule the KV cache codec and the model's page writes share.
float fp8_row_scale(float max_finite, const float* x, int64_t n);

// Direct BF16/FP16 -> FP8. Both widen exactly to FP32 first, so there is a
// single rounding and the results equal f32_to_fp8_*(x_to_f32(h)).
uint8_t bf16_to_fp8_e4m3(uint16_t h);
uint8_t bf16_to_fp8_e5m2(uint16_t h);
uint8_t fp16_to_fp8_e4m3(uint16_t h);
uint8_t fp16_to_fp8_e5m2(uint16_t h);

// Row converters. Contract: in.size() == out.size() (checked; a mismatch is a
// bug and aborts). Element i of out is the scalar conversion of element i of in.
void f32_to_fp8_e4m3_row(std::span<const float> in, std::span<uint8_t> out);
void f32_to_fp8_e5m2_row(std::span<const float> in, std::span<uint8_t> out);
void bf16_to_fp8_e4m3_row(std::span<const uint16_t> in, std::span<uint8_t> out);
void bf16_to_fp8_e5m2_row(std::span<const uint16_t> in, std::span<uint8_t> out);
void fp8_e4m3_to_f32_row(std::span<const uint8_t> in, std::span<float> out);
void fp8_e5m2_to_f32_row(std::span<const uint8_t> in, std::span<float> out);

}  // namespace kvant
