// FP8 e4m3fn / e5m2 conversions against the numpy/ml_dtypes fixtures (all 256
// codes, all 65,536 BF16 and FP16 inputs, a large FP32 sample), against a
// brute-force nearest-value search written here, and the documented special
// cases (saturation, NaN codes). Bit-exact throughout, NaNs included: the
// canonical NaN codes/patterns are the same as ml_dtypes' (docs/FORMATS.md).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/fp16.h"
#include "numerics/fp8.h"
#include "numerics_fixtures.h"

namespace kvant {
namespace {

using testing::load_numerics_fixture;

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

struct Format {
  const char* name;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
  const float* (*table)();
  float max;
  uint8_t max_code;
  uint8_t nan_code;
};

const Format kFormats[] = {
    {"e4m3", fp8_e4m3_to_f32, f32_to_fp8_e4m3, fp8_e4m3_table, kFp8E4m3Max, kFp8E4m3MaxCode,
     kFp8E4m3NaN},
    {"e5m2", fp8_e5m2_to_f32, f32_to_fp8_e5m2, fp8_e5m2_table, kFp8E5m2Max, kFp8E5m2MaxCode,
     kFp8E5m2NaN},
};

TEST(Fp8Decode, AllCodesMatchReference) {
  for (const Format& f : kFormats) {
    const auto want = load_numerics_fixture<uint32_t>(std::string(f.name) + "_to_f32.u32");
    ASSERT_EQ(want.size(), 256u) << f.name;
    for (uint32_t c = 0; c < 256; ++c) {
      EXPECT_EQ(bits(f.decode(uint8_t(c))), want[c]) << f.name << " code 0x" << std::hex << c;
      EXPECT_EQ(bits(f.table()[c]), want[c]) << f.name << " table 0x" << std::hex << c;
    }
  }
}

TEST(Fp8Decode, KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);  // min normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);  // min subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);   // top binade is finite except S.1111.111
  EXPECT_EQ(bits(fp8_e4m3_to_f32(0x80)), 0x80000000u);
  EXPECT_EQ(bits(fp8_e4m3_to_f32(0xff)), 0xffc00000u);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x04), 0x1p-14f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), 0x1p-16f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7c), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8_e5m2_to_f32(0xfc), -std::numeric_limits<float>::infinity());
  for (uint8_t c : {0x7d, 0x7e, 0x7f}) EXPECT_EQ(bits(fp8_e5m2_to_f32(c)), 0x7fc00000u);
  for (uint8_t c : {0xfd, 0xfe, 0xff}) EXPECT_EQ(bits(fp8_e5m2_to_f32(c)), 0xffc00000u);
}

void expect_codes(const char* what, const std::vector<uint8_t>& want, uint8_t (*fn)(uint16_t)) {
  ASSERT_EQ(want.size(), 65536u) << what;
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint8_t got = fn(uint16_t(h));
    if (got != want[h] && ++bad <= 10)
      ADD_FAILURE() << what << " input 0x" << std::hex << h << ": got 0x" << int(got) << " want 0x"
                    << int(want[h]);
  }
  EXPECT_EQ(bad, 0) << what << " mismatches";
}

TEST(Fp8Encode, AllBf16InputsMatchReference) {
  expect_codes("bf16->e4m3", load_numerics_fixture<uint8_t>("bf16_to_e4m3.u8"), bf16_to_fp8_e4m3);
  expect_codes("bf16->e5m2", load_numerics_fixture<uint8_t>("bf16_to_e5m2.u8"), bf16_to_fp8_e5m2);
}

TEST(Fp8Encode, AllFp16InputsMatchReference) {
  expect_codes("fp16->e4m3", load_numerics_fixture<uint8_t>("fp16_to_e4m3.u8"), fp16_to_fp8_e4m3);
  expect_codes("fp16->e5m2", load_numerics_fixture<uint8_t>("fp16_to_e5m2.u8"), fp16_to_fp8_e5m2);
}

TEST(Fp8Encode, DirectEqualsViaF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto x = uint16_t(h);
    ASSERT_EQ(bf16_to_fp8_e4m3(x), f32_to_fp8_e4m3(bf16_to_f32(x))) << h;
    ASSERT_EQ(bf16_to_fp8_e5m2(x), f32_to_fp8_e5m2(bf16_to_f32(x))) << h;
    ASSERT_EQ(fp16_to_fp8_e4m3(x), f32_to_fp8_e4m3(fp16_to_f32(x))) << h;
    ASSERT_EQ(fp16_to_fp8_e5m2(x), f32_to_fp8_e5m2(fp16_to_f32(x))) << h;
  }
}

TEST(Fp8Encode, F32SampleMatchesReference) {
  const auto in = load_numerics_fixture<uint32_t>("f32_sample.u32");
  const auto e4 = load_numerics_fixture<uint8_t>("f32_sample_to_e4m3.u8");
  const auto e5 = load_numerics_fixture<uint8_t>("f32_sample_to_e5m2.u8");
  ASSERT_GT(in.size(), 50000u);
  ASSERT_EQ(e4.size(), in.size());
  ASSERT_EQ(e5.size(), in.size());
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = from_bits(in[i]);
    const uint8_t g4 = f32_to_fp8_e4m3(x), g5 = f32_to_fp8_e5m2(x);
    if ((g4 != e4[i] || g5 != e5[i]) && ++bad <= 10)
      ADD_FAILURE() << "f32 0x" << std::hex << in[i] << ": e4m3 got 0x" << int(g4) << " want 0x"
                    << int(e4[i]) << ", e5m2 got 0x" << int(g5) << " want 0x" << int(e5[i]);
  }
  EXPECT_EQ(bad, 0);
}

// Independent of the encoder's bit tricks: pick the nearest finite code by
// search over the decoded values, ties to the even code, saturating at max.
uint8_t nearest_code(const Format& f, float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  if (a >= f.max) return uint8_t(sign | f.max_code);
  uint8_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= f.max_code; ++c) {
    const double d = std::fabs(double(f.decode(uint8_t(c))) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = uint8_t(c);
      best_d = d;
    }
  }
  return uint8_t(sign | best);
}

TEST(Fp8Encode, MatchesNearestValueSearch) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> exp(100, 150);  // 2^-27 .. 2^23
  std::uniform_int_distribution<uint32_t> man(0, (1u << 23) - 1);
  for (const Format& f : kFormats) {
    int bad = 0;
    for (int i = 0; i < 100000; ++i) {
      uint32_t u = (i & 1) ? any(rng) : ((exp(rng) << 23) | man(rng) | (any(rng) & 0x80000000u));
      const float x = from_bits(u);
      if (std::isnan(x)) continue;
      const uint8_t got = f.encode(x), want = nearest_code(f, x);
      if (got != want && ++bad <= 10)
        ADD_FAILURE() << f.name << " f32 0x" << std::hex << u << ": got 0x" << int(got)
                      << " want 0x" << int(want);
    }
    EXPECT_EQ(bad, 0) << f.name;
  }
}

TEST(Fp8Encode, EveryFiniteCodeRoundTrips) {
  for (const Format& f : kFormats) {
    for (uint32_t c = 0; c < 256; ++c) {
      const float v = f.decode(uint8_t(c));
      if (std::isnan(v) || std::isinf(v)) continue;
      EXPECT_EQ(f.encode(v), c) << f.name << " code 0x" << std::hex << c;
    }
  }
}

TEST(Fp8Encode, SaturatesFiniteOverflowAndInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const Format& f : kFormats) {
    for (float x : {f.max, std::nextafter(f.max, inf), f.max * 1.0625f, f.max * 2, 1e30f,
                    std::numeric_limits<float>::max(), inf}) {
      EXPECT_EQ(f.encode(x), f.max_code) << f.name << " " << x;
      EXPECT_EQ(f.encode(-x), 0x80 | f.max_code) << f.name << " " << -x;
    }
  }
  // Just below the max rounds to it, and the tie below the max goes to even.
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), kFp8E4m3MaxCode);  // tie 448|480: 448 (even) anyway
  EXPECT_EQ(f32_to_fp8_e4m3(432.0f), 0x7e);             // tie 416|448 -> 448 (even mantissa)
  EXPECT_EQ(f32_to_fp8_e5m2(53248.0f), 0x7a);           // tie 49152|57344 -> 49152 (even)
}

TEST(Fp8Encode, NaNKeepsSignAndUsesCanonicalCode) {
  for (const Format& f : kFormats) {
    for (uint32_t payload : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu}) {
      EXPECT_EQ(f.encode(from_bits(payload)), f.nan_code) << f.name;
      EXPECT_EQ(f.encode(from_bits(payload | 0x80000000u)), 0x80 | f.nan_code) << f.name;
    }
    EXPECT_TRUE(std::isnan(f.decode(f.nan_code)));
    EXPECT_TRUE(std::isnan(f.decode(0x80 | f.nan_code)));
  }
}

TEST(Fp8Encode, SubnormalsAndUnderflow) {
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-10f), 0x00);  // half the min subnormal: tie to 0
  EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(0x1p-10f, 1.f)), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(-0x1p-10f), 0x80);      // keeps the sign of zero
  EXPECT_EQ(f32_to_fp8_e4m3(3 * 0x1p-10f), 0x02);   // tie 1|2 -> 2
  EXPECT_EQ(f32_to_fp8_e4m3(15 * 0x1p-10f), 0x08);  // tie 7|8 -> 8 = min normal
  EXPECT_EQ(f32_to_fp8_e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(f32_to_fp8_e5m2(7 * 0x1p-17f), 0x04);  // tie 3|4 -> 4 = min normal
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_fp8_e5m2(-std::numeric_limits<float>::denorm_min()), 0x80);
}

TEST(Fp8Row, ConvertersMatchScalar) {
  std::vector<float> x;
  for (uint32_t c = 0; c < 65536; ++c) x.push_back(bf16_to_f32(uint16_t(c)));
  std::vector<uint16_t> h(65536);
  for (uint32_t c = 0; c < 65536; ++c) h[c] = uint16_t(c);
  std::vector<uint8_t> q4(x.size()), q5(x.size()), b4(x.size()), b5(x.size());
  f32_to_fp8_e4m3_row(x, q4);
  f32_to_fp8_e5m2_row(x, q5);
  bf16_to_fp8_e4m3_row(h, b4);
  bf16_to_fp8_e5m2_row(h, b5);
  std::vector<float> d4(x.size()), d5(x.size());
  fp8_e4m3_to_f32_row(q4, d4);
  fp8_e5m2_to_f32_row(q5, d5);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(q4[i], f32_to_fp8_e4m3(x[i])) << i;
    ASSERT_EQ(q5[i], f32_to_fp8_e5m2(x[i])) << i;
    ASSERT_EQ(b4[i], q4[i]) << i;
    ASSERT_EQ(b5[i], q5[i]) << i;
    ASSERT_EQ(bits(d4[i]), bits(fp8_e4m3_to_f32(q4[i]))) << i;
    ASSERT_EQ(bits(d5[i]), bits(fp8_e5m2_to_f32(q5[i]))) << i;
  }
}

TEST(Fp8RowDeathTest, LengthMismatchAborts) {
  std::vector<float> x(4);
  std::vector<uint8_t> q(3);
  EXPECT_DEATH(f32_to_fp8_e4m3_row(x, q), "check failed");
}

}  // namespace
}  // namespace kvant
