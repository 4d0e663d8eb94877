// FP16 and BF16 <-> FP32 against numpy/ml_dtypes fixtures: all 65,536 FP16
// inputs widened, an FP32 sample (ties, subnormal boundaries, overflow
// thresholds, NaN payloads, random) narrowed. Non-NaN results are compared bit
// for bit. NaN results are compared by NaN-ness, sign and kvant's documented
// rule (quiet bit set, top payload bits kept), because the references differ
// there: numpy keeps signalling NaNs signalling, ml_dtypes returns 0x7fc0.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "numerics/bf16.h"
#include "numerics/fp16.h"
#include "numerics_fixtures.h"

namespace kvant {
namespace {

using testing::load_numerics_fixture;

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

bool fp16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

TEST(Fp16, AllInputsWidenLikeReference) {
  const auto want = load_numerics_fixture<uint32_t>("fp16_to_f32.u32");
  ASSERT_EQ(want.size(), 65536u);
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(bits(fp16_to_f32(uint16_t(h))), want[h]) << "fp16 0x" << std::hex << h;
}

TEST(Fp16, AllNonNaNInputsRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (fp16_is_nan(uint16_t(h))) continue;
    ASSERT_EQ(f32_to_fp16(fp16_to_f32(uint16_t(h))), h) << "fp16 0x" << std::hex << h;
  }
}

TEST(Fp16, NaNInputsStayNaNAndGetQuieted) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (!fp16_is_nan(uint16_t(h))) continue;
    const uint16_t back = f32_to_fp16(fp16_to_f32(uint16_t(h)));
    ASSERT_EQ(back, uint16_t(h | 0x0200u)) << "fp16 0x" << std::hex << h;
  }
}

TEST(Fp16, F32SampleNarrowsLikeReference) {
  const auto in = load_numerics_fixture<uint32_t>("f32_sample.u32");
  const auto want = load_numerics_fixture<uint16_t>("f32_sample_to_fp16.u16");
  ASSERT_GT(in.size(), 50000u);
  ASSERT_EQ(want.size(), in.size());
  int bad = 0, nans = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t got = f32_to_fp16(from_bits(in[i]));
    bool ok = got == want[i];
    if (std::isnan(from_bits(in[i]))) {
      ++nans;
      const uint16_t expect =
          uint16_t(((in[i] >> 16) & 0x8000u) | 0x7e00u | ((in[i] >> 13) & 0x3ffu));
      ok = fp16_is_nan(want[i]) && (want[i] & 0x8000u) == (got & 0x8000u) && got == expect;
    }
    if (!ok && ++bad <= 10)
      ADD_FAILURE() << "f32 0x" << std::hex << in[i] << ": got 0x" << got << " want 0x" << want[i];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(nans, 100);  // the sample really does exercise NaN payloads
}

TEST(Fp16, KnownThresholds) {
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(std::nextafter(65520.0f, 0.f)), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // tie with 65536 goes to even: Inf
  EXPECT_EQ(f32_to_fp16(-1e30f), 0xfc00);
  EXPECT_EQ(f32_to_fp16(0x1p-25f), 0x0000);  // half the min subnormal ties to 0
  EXPECT_EQ(f32_to_fp16(std::nextafter(0x1p-25f, 1.f)), 0x0001);
  EXPECT_EQ(f32_to_fp16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_fp16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_fp16(std::nextafter(0x1p-14f, 0.f)), 0x0400);  // rounds up into normals
}

TEST(Bf16, AllInputsWidenAndRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    ASSERT_EQ(bits(f), h << 16);
    const uint16_t back = f32_to_bf16(f);
    if (bf16_is_nan(uint16_t(h)))
      ASSERT_EQ(back, uint16_t(h | 0x40u)) << "bf16 0x" << std::hex << h;  // quieted
    else
      ASSERT_EQ(back, h) << "bf16 0x" << std::hex << h;
  }
}

TEST(Bf16, F32SampleNarrowsLikeReference) {
  const auto in = load_numerics_fixture<uint32_t>("f32_sample.u32");
  const auto want = load_numerics_fixture<uint16_t>("f32_sample_to_bf16.u16");
  ASSERT_GT(in.size(), 50000u);
  ASSERT_EQ(want.size(), in.size());
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t got = f32_to_bf16(from_bits(in[i]));
    bool ok = got == want[i];
    if (std::isnan(from_bits(in[i]))) {
      const auto expect = uint16_t((in[i] >> 16) | 0x40u);
      ok = bf16_is_nan(want[i]) && (want[i] & 0x8000u) == (got & 0x8000u) && got == expect;
    }
    if (!ok && ++bad <= 10)
      ADD_FAILURE() << "f32 0x" << std::hex << in[i] << ": got 0x" << got << " want 0x" << want[i];
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace kvant
