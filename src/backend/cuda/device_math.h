// Per-element arithmetic of the CUDA kernels, written once for both sides:
// __host__ __device__ under nvcc, plain inline functions in a host compiler.
// The CPU tests (tests/unit/cuda_math_test.cpp) compile this header with g++
// and check it bitwise against numerics/ (bf16.h, fp8.h) and the KV codec's
// dynamic-scale rule, so a GPU kernel that uses these functions stores the
// same bits the CPU backend stores. No CUDA types, no tables in memory: only
// bit operations on FP32 patterns, so the results do not depend on the
// device's rounding modes or flush-to-zero settings.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KV_HD __host__ __device__ __forceinline__
#else
#define KV_HD inline
#endif

namespace kvant::cuda_math {

KV_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

KV_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

KV_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// Round to nearest even; NaN stays a quiet NaN (numerics/bf16.h's rule).
KV_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// FP32 rounded to BF16 and back (what a BF16 operand holds).
KV_HD float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// e4m3fn code -> FP32: S.EEEE.MMM, bias 7, no infinities, S.1111.111 NaN.
KV_HD float e4m3_to_f32(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t e = (code >> 3) & 0xfu, m = code & 0x7u;
  if (e == 0xfu && m == 0x7u) return bits_f32(sign | 0x7fc00000u);
  if (e != 0) return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
  if (m == 0) return bits_f32(sign);
  const float v = float(m) * 0.001953125f;  // subnormal: m * 2^-9, exact
  return sign ? -v : v;
}

// e5m2 code -> FP32: S.EEEEE.MM, bias 15, with infinities.
KV_HD float e5m2_to_f32(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t e = (code >> 2) & 0x1fu, m = code & 0x3u;
  if (e == 0x1fu) return bits_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
  if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 21));
  if (m == 0) return bits_f32(sign);
  const float v = float(m) * 1.52587890625e-05f;  // subnormal: m * 2^-16, exact
  return sign ? -v : v;
}

// FP32 -> FP8 code, nearest even, finite overflow and Inf saturate to the
// largest finite code, NaN to the format's NaN (numerics/fp8.cpp's rule).
// man_bits 3 (e4m3fn) or 2 (e5m2).
KV_HD uint8_t f32_to_fp8(float x, uint32_t man_bits) {
  const uint32_t bias = man_bits == 3 ? 7u : 15u;
  const uint8_t max_code = man_bits == 3 ? 0x7e : 0x7b, nan_code = man_bits == 3 ? 0x7f : 0x7e;
  const uint32_t max_bits = man_bits == 3 ? 0x43e00000u : 0x47600000u;  // 448, 57344
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | nan_code);
  if (a >= max_bits) return uint8_t(sign | max_code);
  const uint32_t shift = 23u - man_bits;
  if (a >= ((128u - bias) << 23)) {
    uint32_t r = a - ((127u - bias) << 23);
    r += (1u << (shift - 1u)) - 1u + ((r >> shift) & 1u);
    return uint8_t(sign | (r >> shift));
  }
  const uint32_t e = a >> 23;
  const uint32_t s = 151u - bias - man_bits - e;
  if (e == 0 || s > 24u) return sign;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint8_t(sign | q);
}

// The dynamic KV scale from a row's largest finite magnitude (kv_codec.h):
// amax / max_finite rounded up to a BF16 value; 1 for an all-zero row.
KV_HD float kv_scale_from_amax(float amax, float max_finite) {
  if (amax == 0.f || max_finite == 0.f) return 1.f;
  float s = amax / max_finite;
  if (!(s > 0.f)) s = 1.17549435e-38f;
  uint32_t b = f32_bits(s);
  if (b & 0xffffu) b = (b & 0xffff0000u) + 0x10000u;
  return bits_f32(b);
}

// |x| when finite, else 0 (the amax rule skips Inf and NaN).
KV_HD float finite_abs(float x) {
  const uint32_t a = f32_bits(x) & 0x7fffffffu;
  return a < 0x7f800000u ? bits_f32(a) : 0.f;
}

// One signed INT4 weight (q - zero) * scale, q and zero in [-8, 7].
KV_HD float int4_value(int32_t q, int32_t zero, float scale) { return float(q - zero) * scale; }

// Nibble i (0: low) of a byte as a signed value: stored as q + 8.
KV_HD int32_t nibble(uint8_t b, int i) { return int32_t((b >> (4 * i)) & 0xfu) - 8; }

}  // namespace kvant::cuda_math
