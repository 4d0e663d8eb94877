// Row kernels of every ISA against the scalar reference: BF16 conversions
// (bitwise), rmsnorm, gated activations, softmax, attention helpers.
// Tolerances, stated per test: elementwise |got - want| <= rtol |want| +
// atol * max|want| (atol covers values the SIMD exp flushes below FLT_MIN);
// dot products are bounded relative to sum |q k|; attn_weighted_sum has a
// fixed FMA order and must match bitwise.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/ref/ref.h"
#include "kernels_test_util.h"

namespace kvant::kernels::test {
namespace {

class KernelOpsTest : public KernelIsaTest {};

const int64_t kLengths[] = {1, 2, 7, 8, 15, 16, 17, 31, 33, 64, 100, 576, 1000, 1536, 4097};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                  double atol_rel_max, const char* what, int64_t n) {
  double mx = 0;
  for (float v : want) mx = std::max(mx, double(std::fabs(v)));
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = rtol * std::fabs(double(want[i])) + atol_rel_max * mx + 1e-30;
    ASSERT_LE(std::fabs(double(got[i]) - want[i]), tol)
        << what << " n=" << n << " i=" << i << " got " << got[i] << " want " << want[i];
  }
}

TEST_P(KernelOpsTest, F32ToBf16Bitwise) {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          1.00390625f,
                          1.01171875f,  // ties to even
                          1.0039063f,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min(),
                          1e-40f,
                          -1e-40f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          3.3895314e38f};
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu,
                        0x7f7fffffu, 0x3f80ffffu, 0x3f808000u, 0x3f818000u, 0x007fffffu}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  for (int64_t n : {int64_t(v.size()), int64_t(0), int64_t(1), int64_t(9), int64_t(23)}) {
    std::vector<uint16_t> a(v.size() + 1, 0x1234), b = a;
    ref::f32_to_bf16(v.data(), a.data(), n);
    T().f32_to_bf16(v.data(), b.data(), n);
    ASSERT_EQ(a, b) << "n=" << n;
  }
}

TEST_P(KernelOpsTest, Bf16ToF32AllValues) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  for (int64_t off : {0, 1, 3}) {
    const int64_t n = 65536 - off;
    std::vector<float> a(size_t(n) + 1, 7.f), b = a;
    ref::bf16_to_f32(all.data() + off, a.data(), n);
    T().bf16_to_f32(all.data() + off, b.data(), n);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "offset " << off;
  }
}

// rtol 1e-5: FP32 lane sums of up to 4k squares, one rsqrt, three products.
TEST_P(KernelOpsTest, RmsNorm) {
  for (int64_t n : kLengths)
    for (float off : {0.f, 1.f}) {
      auto x = random_f32(size_t(n), -3.f, 3.f, uint32_t(n));
      auto w = random_f32(size_t(n), -1.f, 1.f, uint32_t(n) + 9);
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      ref::rmsnorm(x.data(), w.data(), off, 1e-6f, want.data(), n);
      T().rmsnorm(x.data(), w.data(), off, 1e-6f, got.data(), n);
      expect_close(got, want, 1e-5, 1e-7, "rmsnorm", n);
      T().rmsnorm(x.data(), w.data(), off, 1e-6f, x.data(), n);  // in place
      ASSERT_EQ(x, got);
    }
}

// rtol 1e-6 from the ~1-ulp exp and one division; atol 1e-7 * max for
// results the SIMD exp saturates (|gate| > 87).
TEST_P(KernelOpsTest, GatedActivations) {
  for (int64_t n : kLengths) {
    auto g = random_f32(size_t(n), -12.f, 12.f, uint32_t(n) + 1);
    if (n > 4) g[0] = -100.f, g[1] = 100.f, g[2] = 0.f, g[3] = -87.5f;
    auto u = random_f32(size_t(n), -2.f, 2.f, uint32_t(n) + 2);
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ref::silu_mul(g.data(), u.data(), want.data(), n);
    T().silu_mul(g.data(), u.data(), got.data(), n);
    expect_close(got, want, 1e-6, 1e-7, "silu_mul", n);
    ref::gelu_tanh_mul(g.data(), u.data(), want.data(), n);
    T().gelu_tanh_mul(g.data(), u.data(), got.data(), n);
    expect_close(got, want, 1e-6, 1e-7, "gelu_tanh_mul", n);
  }
}

// Exact: the index of the scalar loop, ties to the first, NaNs passed over,
// -0 and +0 equal.
TEST_P(KernelOpsTest, ArgmaxIsTheScalarLoopsIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<int64_t> lengths(std::begin(kLengths), std::end(kLengths));
  lengths.push_back(49152);
  for (int64_t n : lengths) {
    for (int variant = 0; variant < 7; ++variant) {
      auto x = random_f32(size_t(n), -20.f, 20.f, uint32_t(n) * 7 + uint32_t(variant));
      const size_t a = size_t(n) / 3, b = size_t(n) * 2 / 3;
      switch (variant) {
        case 1:  // the maximum twice: the first wins
          x[a] = x[b] = 50.f;
          break;
        case 2:  // NaNs around and at the would-be maximum's place
          for (size_t i = 1; i < x.size(); i += 5) x[i] = nan;
          break;
        case 3:  // NaN first: the loop never moves
          x[0] = nan;
          break;
        case 4:  // zeros of both signs are the maximum
          for (float& v : x) v = -std::fabs(v) - 1.f;
          x[b] = 0.f;
          x[a] = -0.f;
          break;
        case 5:  // -inf everywhere but one place, +inf at the end
          x.assign(x.size(), -inf);
          x[b] = -1.f;
          x.back() = n > 1 ? inf : x.back();
          break;
        case 6:  // all NaN after the first
          for (size_t i = 1; i < x.size(); ++i) x[i] = nan;
          break;
      }
      int64_t want = 0;
      for (int64_t i = 1; i < n; ++i)
        if (x[size_t(i)] > x[size_t(want)]) want = i;
      ASSERT_EQ(ref::argmax(x.data(), n), want) << "ref n=" << n << " variant " << variant;
      ASSERT_EQ(T().argmax(x.data(), n), want) << "n=" << n << " variant " << variant;
    }
  }
  EXPECT_EQ(T().argmax(nullptr, 0), 0);
}

// rtol 1e-5: exp error plus an FP32 lane-parallel sum of up to ~4k terms.
TEST_P(KernelOpsTest, Softmax) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t n : kLengths) {
    for (int variant = 0; variant < 3; ++variant) {
      auto x = random_f32(size_t(n), -20.f, 20.f, uint32_t(n) * 3 + uint32_t(variant));
      if (variant == 1)  // causal-style mask on the tail
        for (int64_t i = n / 2 + 1; i < n; ++i) x[size_t(i)] = ninf;
      if (variant == 2) x.assign(size_t(n), ninf);
      auto want = x, got = x;
      ref::softmax(want.data(), n);
      T().softmax(got.data(), n);
      expect_close(got, want, 1e-5, 1e-7, "softmax", n);
      for (int64_t i = 0; i < n; ++i) {
        if (x[size_t(i)] == ninf) {
          ASSERT_EQ(got[size_t(i)], 0.f) << "masked entry " << i;
        }
      }
    }
  }
}

// |dscore| <= 1e-5 * scale * sum_d |q k| (FP32 lane sums vs a double oracle).
TEST_P(KernelOpsTest, AttnScores) {
  for (int64_t hd : {1, 7, 16, 64, 80, 128, 256}) {
    const int64_t n = 37, ldk = hd + 5;
    auto q = random_f32(size_t(hd), -2.f, 2.f, uint32_t(hd));
    auto k = random_bf16(size_t(n * ldk), -2.f, 2.f, uint32_t(hd) + 1);
    const float scale = 1.f / std::sqrt(float(hd));
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ref::attn_scores(q.data(), k.data(), ldk, n, hd, scale, want.data());
    T().attn_scores(q.data(), k.data(), ldk, n, hd, scale, got.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t d = 0; d < hd; ++d)
        s += std::fabs(double(q[size_t(d)]) * bf16_to_f32(k[size_t(t * ldk + d)]));
      ASSERT_LE(std::fabs(double(got[size_t(t)]) - want[size_t(t)]), 1e-5 * scale * s + 1e-30)
          << "head_dim=" << hd << " t=" << t;
      float alone;  // a row's score must not depend on its batch
      T().attn_scores(q.data(), k.data() + t * ldk, ldk, 1, hd, scale, &alone);
      ASSERT_EQ(std::memcmp(&alone, &got[size_t(t)], 4), 0) << "head_dim=" << hd << " t=" << t;
    }
  }
}

// The multi-query forms (where an ISA has them) give each query exactly its
// one-query result, whatever m, n, the row count mod 16, the rows across
// the kernels' row blocks and the head size.
TEST_P(KernelOpsTest, AttnMultiQueryBitwiseEqualsOneQuery) {
  if (!T().attn_scores_multi || !T().attn_weighted_sum_multi)
    GTEST_SKIP() << "no multi-query kernels";
  // (192: MLA's expanded heads; 576: wider than the kernels' row buffers.)
  for (int64_t hd : {7, 16, 20, 64, 80, 128, 192, 576})
    for (int64_t m : {1, 2, 3, 4, 5, 8, 11, 16})
      for (int64_t n : {1, 15, 16, 17, 40, 128, 129, 333, 600}) {
        const int64_t ldk = hd + 5, ldq = hd + 3, lds = n + 7;
        auto q = random_f32(size_t(m * ldq), -2.f, 2.f, uint32_t(hd * 100 + m * 10 + n));
        auto k = random_bf16(size_t(n * ldk), -2.f, 2.f, uint32_t(hd + n));
        const float scale = 1.f / std::sqrt(float(hd));
        std::vector<float> got(static_cast<size_t>(m * lds), -7.f), one(static_cast<size_t>(n));
        T().attn_scores_multi(q.data(), ldq, m, k.data(), ldk, n, hd, scale, got.data(), lds);
        for (int64_t i = 0; i < m; ++i) {
          T().attn_scores(q.data() + i * ldq, k.data(), ldk, n, hd, scale, one.data());
          ASSERT_EQ(std::memcmp(one.data(), got.data() + i * lds, size_t(n) * 4), 0)
              << "scores hd=" << hd << " m=" << m << " n=" << n << " query " << i;
        }
        // Weighted sums with a different row count per query (causal prefill).
        std::vector<int64_t> ns(static_cast<size_t>(m));
        // (n 1: some queries, and with m 1 all, take no row.)
        for (int64_t i = 0; i < m; ++i)
          ns[size_t(i)] = std::max<int64_t>(0, n - (i * 7) % 13 - (n == 1 && m == 1));
        auto pr = random_f32(size_t(m * lds), 0.f, 1.f, uint32_t(hd * 3 + m + n));
        const int64_t ldo = hd + 2;
        std::vector<float> out(static_cast<size_t>(m * ldo), 5.f), one_out(static_cast<size_t>(hd));
        T().attn_weighted_sum_multi(pr.data(), lds, ns.data(), m, k.data(), ldk, hd, out.data(),
                                    ldo);
        for (int64_t i = 0; i < m; ++i) {
          T().attn_weighted_sum(pr.data() + i * lds, k.data(), ldk, ns[size_t(i)], hd,
                                one_out.data());
          ASSERT_EQ(std::memcmp(one_out.data(), out.data() + i * ldo, size_t(hd) * 4), 0)
              << "weighted sum hd=" << hd << " m=" << m << " n=" << ns[size_t(i)] << " query " << i;
        }
      }
}

// Contract: sequential FMA over t, so every ISA equals the reference bitwise.
TEST_P(KernelOpsTest, AttnWeightedSumBitwise) {
  for (int64_t hd : {1, 7, 16, 64, 80, 128, 130, 256})
    for (int64_t n : {0, 1, 5, 64, 301}) {
      const int64_t ldv = hd + 3;
      auto p = random_f32(size_t(n) + 1, 0.f, 1.f, uint32_t(hd * 7 + n));
      auto v = random_bf16(size_t(n * ldv) + 1, -2.f, 2.f, uint32_t(hd * 5 + n));
      std::vector<float> want(size_t(hd) + 1, 3.f), got = want;
      ref::attn_weighted_sum(p.data(), v.data(), ldv, n, hd, want.data());
      T().attn_weighted_sum(p.data(), v.data(), ldv, n, hd, got.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
          << "head_dim=" << hd << " n=" << n;
    }
}

INSTANTIATE_TEST_SUITE_P(KernelIsa, KernelOpsTest, ::testing::ValuesIn(kAllIsas), isa_param_name);

}  // namespace
}  // namespace kvant::kernels::test
