// INT4 kernels: the Q4 P16 packing round trip, quantize_q8 of every ISA
// bitwise against the scalar reference, every gemm_q4 variant this CPU runs
// (scalar, AVX2, AVX-512 BW, AVX-512 VNNI) bitwise against the reference over
// odd shapes, row ranges, token counts and both zero-point modes, and the
// reference itself against a plain FP64 product of the dequantized weights
// (the activation quantization is the only approximation: NMSE stated).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ref/ref.h"
#include "kernels_test_util.h"
#include "numerics/bf16.h"

namespace kvant::kernels {
namespace {

struct Q4Case {
  std::vector<int8_t> q, zero;
  std::vector<float> scale;
  std::vector<uint8_t> w, offs;
  std::vector<uint16_t> scales;
  Q4Weights view;
};

Q4Case make_q4(int64_t n, int64_t k, int64_t group, bool asym, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> qd(-8, 7);
  std::uniform_real_distribution<float> sd(0.001f, 0.05f);
  Q4Case c;
  const int64_t groups = q4_groups(k, group);
  c.q.resize(size_t(n * k));
  for (auto& v : c.q) v = int8_t(qd(rng));
  c.scale.resize(size_t(n * groups));
  for (auto& s : c.scale) s = bf16_to_f32(f32_to_bf16(sd(rng)));
  if (asym) {
    c.zero.resize(size_t(n * groups));
    for (auto& z : c.zero) z = int8_t(qd(rng));
  }
  const int64_t panels = q4_panels(n);
  c.w.resize(size_t(panels * k * 8));
  c.scales.resize(size_t(panels * groups * 16));
  if (asym) c.offs.resize(c.scales.size());
  pack_q4(c.q.data(), c.scale.data(), asym ? c.zero.data() : nullptr, n, k, group, c.w.data(),
          c.scales.data(), asym ? c.offs.data() : nullptr);
  c.view = {c.w.data(), c.scales.data(), asym ? c.offs.data() : nullptr, n, k, group};
  return c;
}

struct Q8Case {
  std::vector<float> x;
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<int32_t> sum;
  Q8Rows rows;
};

Q8Case make_q8(int64_t m, int64_t k, uint32_t seed) {
  Q8Case c;
  c.x = test::random_f32(size_t(m * k), -3.f, 3.f, seed);
  if (k >= 64) std::fill(c.x.begin() + 32, c.x.begin() + 64, 0.f);  // an all-zero block
  c.q.resize(size_t(m * k));
  c.s.resize(size_t(m * k / 32));
  c.sum.resize(c.s.size());
  for (int64_t i = 0; i < m; ++i)
    ref::quantize_q8(c.x.data() + i * k, k, c.q.data() + i * k, c.s.data() + i * k / 32,
                     c.sum.data() + i * k / 32);
  c.rows = {c.q.data(), c.s.data(), c.sum.data(), k, k / 32};
  return c;
}

TEST(Q4Pack, LogicalValuesRoundTrip) {
  for (bool asym : {false, true}) {
    auto c = make_q4(37, 160, 64, asym, 7);  // groups of 64, 64 and 32
    for (int64_t j = 0; j < 37; ++j)
      for (int64_t col = 0; col < 160; ++col) {
        const float z = asym ? c.zero[size_t(j * 3 + col / 64)] : 0.f;
        const float want = (float(c.q[size_t(j * 160 + col)]) - z) * c.scale[size_t(j * 3 + col / 64)];
        ASSERT_EQ(q4_weight(c.view, j, col), want) << j << "," << col << " asym " << asym;
      }
  }
}

class Q4IsaTest : public test::KernelIsaTest {};

TEST_P(Q4IsaTest, QuantizeQ8BitwiseEqualsReference) {
  for (int64_t k : {32, 64, 96, 576}) {
    auto x = test::random_f32(size_t(k), -50.f, 50.f, uint32_t(k));
    std::fill(x.begin(), x.begin() + 32, 0.f);
    if (k > 64) x[40] = 1e-30f;  // a tiny block max
    const auto nk = static_cast<size_t>(k), nb = nk / 32;
    std::vector<int8_t> q0(nk), q1(nk);
    std::vector<float> s0(nb), s1(nb);
    std::vector<int32_t> u0(nb), u1(nb);
    ref::quantize_q8(x.data(), k, q0.data(), s0.data(), u0.data());
    T().quantize_q8(x.data(), k, q1.data(), s1.data(), u1.data());
    EXPECT_EQ(q0, q1) << "k " << k;
    EXPECT_EQ(0, std::memcmp(s0.data(), s1.data(), s0.size() * 4)) << "k " << k;
    EXPECT_EQ(u0, u1) << "k " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Q4IsaTest, ::testing::ValuesIn(kAllIsas), test::isa_param_name);

TEST(GemmQ4, EveryVariantBitwiseEqualsReference) {
  Q4Variant v[8];
  const int nv = q4_variants(v, 8);
  ASSERT_GE(nv, 1);
  std::printf("gemm_q4 variants on this CPU:");
  for (int i = 0; i < nv; ++i) std::printf(" %s", v[i].name);
  std::printf("\n");
  struct Shape { int64_t n, k, group; };
  const Shape shapes[] = {{1, 32, 32}, {15, 64, 32}, {16, 128, 128}, {17, 128, 64},
                          {40, 256, 128}, {100, 96, 32}, {64, 576, 64}, {48, 1536, 128}, {33, 576, 128}, {16, 96, 64}};
  uint32_t seed = 1;
  for (const auto& sh : shapes)
    for (bool asym : {false, true})
      for (int64_t m : {1, 2, 3, 4, 5, 9}) {
        auto w = make_q4(sh.n, sh.k, sh.group, asym, seed++);
        auto x = make_q8(m, sh.k, seed++);
        const int64_t ldy = sh.n + 3;
        std::vector<float> want(size_t(m * ldy), -1.f);
        ref::gemm_q4(x.rows, w.view, want.data(), ldy, m, 0, sh.n);
        for (int i = 1; i < nv; ++i) {
          // The whole range, and a slice starting at a panel boundary.
          for (int64_t n0 : {int64_t(0), sh.n > 16 ? int64_t(16) : int64_t(0)}) {
            std::vector<float> got(size_t(m * ldy), -1.f);
            v[i].fn(x.rows, w.view, got.data(), ldy, m, n0, sh.n);
            for (int64_t r = 0; r < m; ++r)
              for (int64_t j = 0; j < ldy; ++j) {
                const float e = j >= n0 && j < sh.n ? want[size_t(r * ldy + j)] : -1.f;
                ASSERT_EQ(std::memcmp(&e, &got[size_t(r * ldy + j)], 4), 0)
                    << v[i].name << " n " << sh.n << " k " << sh.k << " g " << sh.group << " m "
                    << m << " asym " << asym << " n0 " << n0 << " at (" << r << "," << j
                    << "): " << e << " vs " << got[size_t(r * ldy + j)];
              }
          }
        }
      }
}

TEST(GemmQ4, ReferenceMatchesDequantizedProduct) {
  const int64_t n = 48, k = 288, m = 3;  // 288 = 2 x 128 + 32: a short last group
  for (bool asym : {false, true})
   for (int64_t group : {32, 64, 128}) {
    auto w = make_q4(n, k, group, asym, 99);
    auto x = make_q8(m, k, 100);
    std::vector<float> y(size_t(m * n));
    ref::gemm_q4(x.rows, w.view, y.data(), n, m, 0, n);
    double err = 0, ref_energy = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t c = 0; c < k; ++c) d += double(q4_weight(w.view, j, c)) * x.x[size_t(i * k + c)];
        err += (y[size_t(i * n + j)] - d) * (y[size_t(i * n + j)] - d);
        ref_energy += d * d;
      }
    // int8 activations per 32-block: NMSE ~ (1/254)^2 / 3 per element.
    EXPECT_LT(err / ref_energy, 1e-4) << "asym " << asym << " group " << group;
  }
}

}  // namespace
}  // namespace kvant::kernels
