// FP8-weight GEMM (gemm_f8) of every ISA against the scalar reference:
// random codes over the whole e4m3 range (subnormals and both zeros
// included), 128-column block scales, smaller groups, one group per row
// (per-channel), short last groups, unaligned column ranges. Every table
// must give the reference bits (the products are exact and the order is the
// contract's). Batch invariance, "nothing outside [n0, n1) is written", NaN
// codes and the packer's inverse are checked for every ISA.
#include <cmath>
#include <cstring>
#include <string>

#include "core/cpu.h"
#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/ref/ref.h"
#include "kernels_test_util.h"
#include "numerics/fp8.h"

namespace kvant::kernels::test {
namespace {

class KernelF8Test : public KernelIsaTest {};

struct F8Problem {
  int64_t m, n, k, group, ldx;
  std::vector<uint16_t> x;
  std::vector<uint8_t> codes, wp;
  std::vector<float> scale, sp;
  F8Weights W;
};

F8Problem make_f8(int64_t m, int64_t n, int64_t k, int64_t group, uint32_t seed, bool nan) {
  F8Problem p{m, n, k, group, k + (seed % 3) * 8, {}, {}, {}, {}, {}, {}};
  p.x = random_bf16(size_t(m * p.ldx), -1.f, 1.f, seed);
  std::mt19937 rng(seed + 7);
  p.codes.resize(size_t(n * k));
  for (auto& c : p.codes) {
    c = uint8_t(rng());
    if (!nan && (c & 0x7f) == 0x7f) c ^= 1;
  }
  const int64_t ng = f8_groups(k, group);
  p.scale = random_f32(size_t(n * ng), 0.001f, 0.01f, seed + 3);
  p.wp.assign(size_t(f8_packed_bytes(n, k, group)), 0xaa);
  p.sp.assign(size_t(q4_panels(n) * ng * 16), -1.f);
  const bool saw_nan = pack_f8(p.codes.data(), p.scale.data(), n, k, group, p.wp.data(), p.sp.data());
  p.W = {p.wp.data(), p.sp.data(), n, k, group, saw_nan,
         f8_subnormal_share(p.codes.data(), n * k)};
  return p;
}

constexpr float kSentinel = -12345.f;

std::vector<float> run(decltype(KernelTable::gemm_f8) f, const F8Problem& p, int64_t i0, int64_t m,
                       int64_t n0, int64_t n1) {
  const int64_t ldy = p.n + 3;
  std::vector<float> y(size_t(m * ldy), kSentinel);
  f(p.x.data() + i0 * p.ldx, p.ldx, p.W, y.data(), ldy, m, n0, n1);
  return y;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

using F8Fn = decltype(KernelTable::gemm_f8);

// Whether f promises the reference's bits (every gemm_f8 but VDPBF16PS's).
bool exact(F8Fn f) {
  return f != avx512bf16::gemm_f8 && f != avx512bf16_emulated::gemm_f8;
}

// got against the reference's want for row i, column j: the same bits (or
// NaN on both sides: payloads may differ) for exact kernels, else within
// the two-orders bound.
::testing::AssertionResult close_to_reference(F8Fn f, const F8Problem& p, int64_t i, int64_t j,
                                              float got, float want) {
  if (same_bits(got, want) || (std::isnan(got) && std::isnan(want)))
    return ::testing::AssertionSuccess();
  if (exact(f) || !std::isfinite(want))
    return ::testing::AssertionFailure() << "got " << got << " want " << want;
  double abs_sum = 0;
  for (int64_t c = 0; c < p.k; ++c)
    abs_sum += std::fabs(double(bf16_to_f32(p.x[size_t(i * p.ldx + c)])) * f8_weight(p.W, j, c));
  const double bound = double(2 * p.k + 4) * 0x1p-24 * abs_sum;
  if (std::fabs(double(got) - double(want)) <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << got << " want " << want << " bound " << bound;
}

void check_matches_reference(F8Fn f) {
  const int64_t ks[] = {2, 16, 34, 37, 128, 130, 256, 300, 512, 1030};
  const int64_t ms[] = {1, 2, 3, 5, 8, 9, 12, 13, 31};
  const int64_t ns[] = {1, 5, 16, 17, 33, 130, 300};
  uint32_t seed = 1;
  for (int64_t k : ks)
    for (int64_t m : ms) {
      // Groups that are not whole quads (6, 2, 10) pad to whole quads.
      const int64_t groups[] = {128, 64, 32, 256, k, 6, 2, 10};
      const int64_t group = k % 2 ? k : groups[seed % 8], n = ns[(seed / 3) % 7];
      F8Problem p = make_f8(m, n, k, group, seed++, false);
      const int64_t n0 = seed % 3 == 0 ? 0 : int64_t(seed % uint32_t(n)) / 16 * 16, n1 = n;
      const int64_t ldy = n + 3;
      auto ref = run(ref::gemm_f8, p, 0, m, n0, n1);
      auto y = run(f, p, 0, m, n0, n1);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldy; ++j) {
          const float got = y[size_t(i * ldy + j)], want = ref[size_t(i * ldy + j)];
          if (j < n0 || j >= n1) {
            ASSERT_EQ(got, kSentinel) << "wrote outside [n0, n1) at i=" << i << " j=" << j;
            continue;
          }
          ASSERT_TRUE(close_to_reference(f, p, i, j, got, want))
              << "m=" << m << " n=" << n << " k=" << k << " group=" << group << " i=" << i
              << " j=" << j;
        }
    }
}

// The kernel's whole product against the reference's: the same bits, or
// NaN on both sides (NaN payloads may differ).
void expect_reference(decltype(KernelTable::gemm_f8) f, const F8Problem& p, const std::string& what) {
  const int64_t ldy = p.n + 3;
  auto ref = run(ref::gemm_f8, p, 0, p.m, 0, p.n), y = run(f, p, 0, p.m, 0, p.n);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      const float got = y[size_t(i * ldy + j)], want = ref[size_t(i * ldy + j)];
      ASSERT_TRUE(close_to_reference(f, p, i, j, got, want)) << what << " row " << i << " col " << j;
    }
}

// Rows whose largest |x| is 2^6 or more take x * 2^K with K < 120
// (kernels.h): still the reference's bits while no product underflows
// and no sum overflows. Row i is x * 2^shift[i].
void check_large_rows(decltype(KernelTable::gemm_f8) f) {
  for (int64_t group : {128, 6, 300}) {
    F8Problem p = make_f8(7, 50, 300, group, 77, false);
    const int shifts[] = {0, 6, 7, 20, 60, 100, 110};
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t c = 0; c < p.k; ++c) {
        uint16_t& b = p.x[size_t(i * p.ldx + c)];
        if ((b & 0x7f80) != 0) b = uint16_t(b + (shifts[i] << 7));  // x * 2^shift
      }
    expect_reference(f, p, "group=" + std::to_string(group));
  }
}

// Inf and NaN activations give what the reference gives (Inf or NaN).
void check_nonfinite_rows(decltype(KernelTable::gemm_f8) f) {
  F8Problem p = make_f8(3, 20, 64, 32, 5, false);
  p.x[size_t(0 * p.ldx + 5)] = 0x7f80;   // +Inf
  p.x[size_t(1 * p.ldx + 40)] = 0x7fc0;  // NaN
  expect_reference(f, p, "inf/nan x");
}

void check_batch_invariance(decltype(KernelTable::gemm_f8) f) {
  F8Problem p = make_f8(29, 70, 384, 128, 42, false);
  const int64_t ldy = p.n + 3;
  auto all = run(f, p, 0, p.m, 0, p.n);
  for (int64_t i = 0; i < p.m; i += 5) {
    auto one = run(f, p, i, 1, 0, p.n);
    for (int64_t j = 0; j < p.n; ++j)
      ASSERT_TRUE(same_bits(one[size_t(j)], all[size_t(i * ldy + j)])) << "row " << i << " col " << j;
  }
  // Columns split across two calls, as threads split them.
  auto lo = run(f, p, 0, p.m, 0, 48), hi = run(f, p, 0, p.m, 48, p.n);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j)
      ASSERT_TRUE(same_bits((j < 48 ? lo : hi)[size_t(i * ldy + j)], all[size_t(i * ldy + j)]));
}

TEST_P(KernelF8Test, MatchesReference) { check_matches_reference(T().gemm_f8); }

TEST_P(KernelF8Test, LargeActivationRowsMatchReference) { check_large_rows(T().gemm_f8); }

TEST_P(KernelF8Test, InfAndNanActivationsAsReference) { check_nonfinite_rows(T().gemm_f8); }

TEST_P(KernelF8Test, BatchInvariantAcrossRowsAndColumnSplits) { check_batch_invariance(T().gemm_f8); }

TEST_P(KernelF8Test, NanCodesGiveNanRows) {
  F8Problem p = make_f8(3, 40, 256, 128, 5, false);
  // Row 7 gets a NaN code (0xff), row 20 the other one (0x7f).
  auto set = [&](int64_t row, int64_t col, uint8_t code) {
    p.codes[size_t(row * p.k + col)] = code;
  };
  set(7, 3, 0xff);
  set(20, 200, 0x7f);
  p.W.nan_codes = pack_f8(p.codes.data(), p.scale.data(), p.n, p.k, p.group, p.wp.data(), p.sp.data());
  ASSERT_TRUE(p.W.nan_codes);
  auto y = run(T().gemm_f8, p, 0, p.m, 0, p.n);
  const int64_t ldy = p.n + 3;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j)
      EXPECT_EQ(std::isnan(y[size_t(i * ldy + j)]), j == 7 || j == 20) << "i=" << i << " j=" << j;
}

// Matrices with subnormal codes decode at 2^-104 where FP32 denormals are
// slow (f8_subnormal_decode) and at 2^-120 elsewhere: both give the
// reference's bits, NaN codes included. Each decode forced in turn.
TEST_P(KernelF8Test, SubnormalCodesGiveTheReferenceBitsInBothDecodes) {
  for (int forced : {0, 1}) {
    set_f8_subnormal_decode(forced);
    SCOPED_TRACE(forced ? "2^-104 decode" : "2^-120 decode");
    check_matches_reference(T().gemm_f8);
    check_large_rows(T().gemm_f8);
    check_nonfinite_rows(T().gemm_f8);
    // Every exponent-0 code (zeros and subnormals, both signs) beside NaN codes.
    F8Problem p = make_f8(5, 33, 130, 64, 21, true);
    for (size_t i = 0; i < p.codes.size(); i += 3) p.codes[i] = uint8_t((i / 3) % 8 | (i % 2 ? 0x80 : 0));
    p.W.nan_codes = pack_f8(p.codes.data(), p.scale.data(), p.n, p.k, p.group, p.wp.data(), p.sp.data());
    p.W.subnormal_share = f8_subnormal_share(p.codes.data(), p.n * p.k);
    ASSERT_GT(p.W.subnormal_share, 0.f);
    expect_reference(T().gemm_f8, p, "exponent-0 and NaN codes");
  }
  set_f8_subnormal_decode(-1);
}

TEST(KernelF8Pack, CountsSubnormalCodes) {
  const uint8_t none[] = {0x00, 0x80, 0x08, 0x88, 0x7f, 0x30};
  EXPECT_EQ(f8_subnormal_share(none, 6), 0.f);
  for (uint8_t c : {0x01, 0x07, 0x81, 0x87}) {
    const uint8_t one[] = {0x30, 0x00, c, 0x40};
    EXPECT_EQ(f8_subnormal_share(one, 4), 0.25f) << int(c);
  }
}

// The rule: forced off or on, or (left to choose) only where denormals are
// slow and the share times the rows a decoded vector feeds reaches 1/1024.
TEST(KernelF8Pack, SubnormalDecodeRule) {
  set_f8_subnormal_decode(0);
  EXPECT_FALSE(f8_subnormal_decode(0.5f, 64));
  set_f8_subnormal_decode(1);
  EXPECT_TRUE(f8_subnormal_decode(1e-6f, 1));
  EXPECT_FALSE(f8_subnormal_decode(0.f, 64));
  set_f8_subnormal_decode(-1);
  if (std::getenv("KVANT_F8_DENORMAL_DECODE")) return;
  const bool slow = f8_denormals_slow();
  EXPECT_EQ(f8_subnormal_decode(1.f / 16, 1), slow);
  EXPECT_FALSE(f8_subnormal_decode(1e-4f, 1));
  EXPECT_EQ(f8_subnormal_decode(1e-4f, 512), slow);
}

TEST(KernelF8Pack, WeightIsCodeTimesItsGroupScale) {
  F8Problem p = make_f8(1, 37, 300, 128, 9, true);
  for (int64_t j = 0; j < p.n; ++j)
    for (int64_t c = 0; c < p.k; ++c) {
      const float want = fp8_e4m3_to_f32(p.codes[size_t(j * p.k + c)]) *
                         p.scale[size_t(j * f8_groups(p.k, p.group) + c / p.group)];
      const float got = f8_weight(p.W, j, c);
      ASSERT_TRUE(same_bits(got, want) || (std::isnan(got) && std::isnan(want))) << j << "," << c;
    }
}

// The VDPBF16PS kernel's code with the instruction replaced by two FMAs in
// its order: its tiling, tables and lane sums on CPUs without AVX512_BF16.
TEST(KernelF8EmulatedDpbf16, MatchesReferenceAndIsBatchInvariant) {
  if (!table_for(Isa::Avx512) || !cpu_features().avx512_vbmi)
    GTEST_SKIP() << "needs AVX-512 F/BW/VL/DQ and VBMI";
  const F8Fn f = avx512bf16_emulated::gemm_f8;
  check_matches_reference(f);
  check_large_rows(f);
  check_nonfinite_rows(f);
  check_batch_invariance(f);
}

INSTANTIATE_TEST_SUITE_P(KernelIsa, KernelF8Test, ::testing::ValuesIn(kAllIsas), isa_param_name);

}  // namespace
}  // namespace kvant::kernels::test
