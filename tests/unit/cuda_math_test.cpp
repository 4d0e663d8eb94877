// The CUDA kernels' per-element arithmetic (backend/cuda/device_math.h),
// compiled here by the host compiler and checked bitwise against numerics/
// and the KV codec: every FP8 code, FP32 values around every rounding
// boundary, and the dynamic-scale rule. Runs in every build, GPU or not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/device_math.h"
#include "kvcache/kv_codec.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant {
namespace {

namespace cm = cuda_math;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// FP32 values that exercise every path: specials, each FP8 code's value and
// the midpoints between neighbours (ties), their neighbours one ulp away,
// FP32 subnormals, and random bit patterns.
std::vector<float> probe_values() {
  std::vector<float> v = {0.f, -0.f, INFINITY, -INFINITY, NAN, -NAN, 1e-45f, -1e-45f,
                          1.17549435e-38f, 448.f, 464.f, 480.f, 57344.f, 61440.f, 1e30f, -1e30f};
  for (int c = 0; c < 256; ++c)
    for (const float* t : {fp8_e4m3_table(), fp8_e5m2_table()}) {
      const float a = t[c], b = t[(c + 1) & 0xff];
      if (!std::isfinite(a)) continue;
      v.push_back(a);
      if (std::isfinite(b)) {
        const float mid = (a + b) / 2;
        v.push_back(mid);
        v.push_back(std::nextafter(mid, INFINITY));
        v.push_back(std::nextafter(mid, -INFINITY));
      }
    }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  std::normal_distribution<float> g(0.f, 30.f);
  for (int i = 0; i < 100000; ++i) v.push_back(g(rng));
  return v;
}

TEST(CudaMath, Fp8DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_TRUE(same(cm::e4m3_to_f32(uint8_t(c)), fp8_e4m3_to_f32(uint8_t(c)))) << "e4m3 " << c;
    EXPECT_TRUE(same(cm::e5m2_to_f32(uint8_t(c)), fp8_e5m2_to_f32(uint8_t(c)))) << "e5m2 " << c;
  }
}

TEST(CudaMath, Fp8AndBf16EncodeBitwise) {
  int64_t checked = 0;
  for (float f : probe_values()) {
    ASSERT_EQ(cm::f32_to_fp8(f, 3), f32_to_fp8_e4m3(f)) << "e4m3 of " << f << " bits " << bits(f);
    ASSERT_EQ(cm::f32_to_fp8(f, 2), f32_to_fp8_e5m2(f)) << "e5m2 of " << f << " bits " << bits(f);
    ASSERT_EQ(cm::f32_to_bf16(f), f32_to_bf16(f)) << "bf16 of " << f;
    ++checked;
  }
  EXPECT_GT(checked, 300000);
}

TEST(CudaMath, DynamicScaleMatchesTheCodec) {
  std::mt19937 rng(11);
  for (int r = 0; r < 2000; ++r) {
    const int n = 1 + int(rng() % 256);
    std::vector<float> x(static_cast<size_t>(n));
    const float mag = std::ldexp(1.f, int(rng() % 60) - 30);
    std::uniform_real_distribution<float> u(-mag, mag);
    for (float& e : x) e = u(rng);
    if (r % 7 == 0) x[0] = INFINITY;
    if (r % 11 == 0) x[size_t(n - 1)] = NAN;
    if (r % 13 == 0) std::fill(x.begin(), x.end(), 0.f);
    float amax = 0.f;
    for (float e : x) amax = std::max(amax, cm::finite_abs(e));
    for (KvDType d : {KvDType::kFp8E4m3, KvDType::kFp8E5m2}) {
      const float max_finite = d == KvDType::kFp8E4m3 ? kFp8E4m3Max : kFp8E5m2Max;
      EXPECT_EQ(bits(cm::kv_scale_from_amax(amax, max_finite)),
                bits(kv_dynamic_scale(d, x.data(), n)))
          << "row " << r;
    }
  }
}

TEST(CudaMath, Int4Nibbles) {
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(cm::nibble(uint8_t(b), 0), (b & 0xf) - 8);
    EXPECT_EQ(cm::nibble(uint8_t(b), 1), (b >> 4) - 8);
  }
  EXPECT_EQ(cm::int4_value(-8, 3, 0.5f), -5.5f);
}

}  // namespace
}  // namespace kvant
