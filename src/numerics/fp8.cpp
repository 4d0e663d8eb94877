// FP8 e4m3fn / e5m2 <-> FP32: compile-time decode tables and a bit-level
// encoder shared by both formats (parameterised by exponent/mantissa widths).
// Works on FP32 bit patterns only, so the result never depends on the FPU's
// rounding mode or on flush-to-zero settings. Does not own scaling or any
// SIMD path (those live in kernels/, tested against these functions).
#include "numerics/fp8.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "numerics/bf16.h"
#include "numerics/fp16.h"

namespace kvant {
namespace {

struct Fp8Format {
  uint32_t exp_bits;
  uint32_t man_bits;
  uint32_t bias;
  bool has_inf;           // e5m2: exponent all-ones with mantissa 0 is Inf
  uint8_t max_code;       // largest finite, positive
  uint8_t nan_code;       // produced for NaN inputs, positive
  uint32_t max_f32_bits;  // FP32 bits of the largest finite value
};

constexpr Fp8Format kE4m3{
    4, 3, 7, false, kFp8E4m3MaxCode, kFp8E4m3NaN, std::bit_cast<uint32_t>(kFp8E4m3Max)};
constexpr Fp8Format kE5m2{
    5, 2, 15, true, kFp8E5m2MaxCode, kFp8E5m2NaN, std::bit_cast<uint32_t>(kFp8E5m2Max)};

constexpr uint32_t kF32QuietNaN = 0x7fc00000u;
constexpr uint32_t kF32Inf = 0x7f800000u;

constexpr uint32_t decode_bits(const Fp8Format& f, uint32_t code) {
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t exp_max = (1u << f.exp_bits) - 1u;
  const uint32_t e = (code >> f.man_bits) & exp_max;
  const uint32_t m = code & ((1u << f.man_bits) - 1u);
  if (e == exp_max) {
    if (f.has_inf) {
      if (m == 0) return sign | kF32Inf;
      return sign | kF32QuietNaN;
    }
    // e4m3fn: only S.1111.111 is NaN; the rest of the top binade is finite.
    if (m == (1u << f.man_bits) - 1u) return sign | kF32QuietNaN;
  }
  if (e != 0) return sign | ((e - f.bias + 127u) << 23) | (m << (23u - f.man_bits));
  if (m == 0) return sign;
  // Subnormal m * 2^(1 - bias - man_bits): normalise so the leading 1 is implicit.
  uint32_t exp = 1u - f.bias + 127u;  // biased FP32 exponent of the FP8 min normal
  uint32_t mm = m;
  while ((mm & (1u << f.man_bits)) == 0) {
    mm <<= 1;
    --exp;
  }
  mm &= (1u << f.man_bits) - 1u;
  return sign | (exp << 23) | (mm << (23u - f.man_bits));
}

constexpr std::array<float, 256> make_table(const Fp8Format& f) {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = std::bit_cast<float>(decode_bits(f, c));
  return t;
}

// 64-byte alignment: a table is exactly 16 cache lines, so a gather touches no
// line it does not need.
alignas(64) constexpr std::array<float, 256> kE4m3Table = make_table(kE4m3);
alignas(64) constexpr std::array<float, 256> kE5m2Table = make_table(kE5m2);

static_assert(std::bit_cast<uint32_t>(kE4m3Table[kFp8E4m3MaxCode]) ==
              std::bit_cast<uint32_t>(kFp8E4m3Max));
static_assert(std::bit_cast<uint32_t>(kE5m2Table[kFp8E5m2MaxCode]) ==
              std::bit_cast<uint32_t>(kFp8E5m2Max));
static_assert(kE4m3Table[0x01] == 0x1p-9f && kE5m2Table[0x01] == 0x1p-16f);

inline uint8_t encode(const Fp8Format& f, float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const auto sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > kF32Inf) return uint8_t(sign | f.nan_code);
  // Saturate: finite overflow and Inf alike. Below the max, rounding can reach
  // the max but never pass it, so no further overflow check is needed.
  if (a >= f.max_f32_bits) return uint8_t(sign | f.max_code);
  const uint32_t shift = 23u - f.man_bits;
  const uint32_t min_normal_bits = (128u - f.bias) << 23;
  if (a >= min_normal_bits) {
    // Rebias the exponent in place, then round the mantissa to nearest even;
    // a carry out of the mantissa correctly bumps the exponent.
    uint32_t r = a - ((127u - f.bias) << 23);
    r += (1u << (shift - 1u)) - 1u + ((r >> shift) & 1u);
    return uint8_t(sign | (r >> shift));
  }
  // Subnormal target: count units of 2^(1 - bias - man_bits). The FP32 value is
  // m * 2^(e - 150) with the implicit bit in m, so the unit count is m >> s.
  const uint32_t e = a >> 23;
  const uint32_t s = 151u - f.bias - f.man_bits - e;  // >= 24 - man_bits here
  // s > 24 means the value is below half the smallest subnormal (and s == 24
  // with m == 2^23 is exactly half, which ties to even = 0 below). FP32
  // subnormals (e == 0) land here too.
  if (e == 0 || s > 24u) return sign;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q may become the min normal: fine
  return uint8_t(sign | q);
}

template <class In, class Fn>
void convert_row(std::span<const In> in, std::span<uint8_t> out, Fn fn) {
  KV_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = fn(in[i]);
}

void decode_row(const std::array<float, 256>& table, std::span<const uint8_t> in,
                std::span<float> out) {
  KV_CHECK_EQ(in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = table[in[i]];
}

}  // namespace

float fp8_e4m3_to_f32(uint8_t v) { return kE4m3Table[v]; }
float fp8_e5m2_to_f32(uint8_t v) { return kE5m2Table[v]; }
float fp8_row_scale(float max_finite, const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isfinite(a) && a > amax) amax = a;
  }
  if (amax == 0.0f || max_finite == 0.0f) return 1.0f;
  float s = amax / max_finite;
  // amax below max_finite * FLT_MIN would underflow to a zero scale; the
  // smallest normal keeps decoding finite at a tiny loss for such rows.
  if (!(s > 0.0f)) s = 1.17549435e-38f;
  uint32_t b;
  std::memcpy(&b, &s, 4);
  if (b & 0xffffu) b = (b & 0xffff0000u) + 0x10000u;  // round up to BF16
  std::memcpy(&s, &b, 4);
  return s;
}

uint8_t f32_to_fp8_e4m3(float f) { return encode(kE4m3, f); }
uint8_t f32_to_fp8_e5m2(float f) { return encode(kE5m2, f); }
const float* fp8_e4m3_table() { return kE4m3Table.data(); }
const float* fp8_e5m2_table() { return kE5m2Table.data(); }

uint8_t bf16_to_fp8_e4m3(uint16_t h) { return encode(kE4m3, bf16_to_f32(h)); }
uint8_t bf16_to_fp8_e5m2(uint16_t h) { return encode(kE5m2, bf16_to_f32(h)); }
uint8_t fp16_to_fp8_e4m3(uint16_t h) { return encode(kE4m3, fp16_to_f32(h)); }
uint8_t fp16_to_fp8_e5m2(uint16_t h) { return encode(kE5m2, fp16_to_f32(h)); }

void f32_to_fp8_e4m3_row(std::span<const float> in, std::span<uint8_t> out) {
  convert_row(in, out, [](float x) { return encode(kE4m3, x); });
}
void f32_to_fp8_e5m2_row(std::span<const float> in, std::span<uint8_t> out) {
  convert_row(in, out, [](float x) { return encode(kE5m2, x); });
}
void bf16_to_fp8_e4m3_row(std::span<const uint16_t> in, std::span<uint8_t> out) {
  convert_row(in, out, [](uint16_t h) { return encode(kE4m3, bf16_to_f32(h)); });
}
void bf16_to_fp8_e5m2_row(std::span<const uint16_t> in, std::span<uint8_t> out) {
  convert_row(in, out, [](uint16_t h) { return encode(kE5m2, bf16_to_f32(h)); });
}
void fp8_e4m3_to_f32_row(std::span<const uint8_t> in, std::span<float> out) {
  decode_row(kE4m3Table, in, out);
}
void fp8_e5m2_to_f32_row(std::span<const uint8_t> in, std::span<float> out) {
  decode_row(kE5m2Table, in, out);
}

}  // namespace kvant
