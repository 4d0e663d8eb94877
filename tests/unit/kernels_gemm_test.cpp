// BF16 GEMM kernels of every ISA against the scalar reference, on random
// shapes with odd k tails and unaligned column ranges.
// Tolerances: the FP32-FMA tables (avx2, avx512) must equal the reference bit
// for bit (same sequential order, exact BF16 products); avx512bf16 uses
// VDPBF16PS's own pair order and denormal flushing, so it gets the bound for
// two summation orders of the same terms, |dy| <= 2 k 2^-24 sum_k |x w|.
// Batch invariance, packed == plain, and "nothing outside [n0, n1) is
// written" are checked bitwise for every ISA. The avx512bf16 kernel is also
// run with VDPBF16PS emulated (KernelGemmEmulatedBf16) wherever AVX-512 is,
// so its tiling is covered on CPUs without AVX512_BF16.
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/ref/ref.h"
#include "kernels_test_util.h"

namespace kvant::kernels::test {
namespace {

class KernelGemmTest : public KernelIsaTest {};

struct Problem {
  int64_t m, n, k, ldx;
  std::vector<uint16_t> x, w, wp;
};

Problem make_problem(int64_t m, int64_t n, int64_t k, uint32_t seed, const KernelTable& T) {
  Problem p{m, n, k, k + (seed % 3) * 8, {}, {}, {}};
  p.x = random_bf16(size_t(m * p.ldx), -1.f, 1.f, seed);
  p.w = random_bf16(size_t(n * k), -1.f, 1.f, seed + 1);
  p.wp.assign(size_t(gemm_bf16_packed_size(n, k)), 0xaaaa);
  T.pack_bf16(p.w.data(), n, k, p.wp.data());
  return p;
}

constexpr float kSentinel = -12345.f;

// y over columns [n0, n1) with a sentinel everywhere else; ldy = n + 3.
std::vector<float> run(const KernelTable& T, const Problem& p, bool packed, int64_t i0, int64_t m,
                       int64_t n0, int64_t n1) {
  const int64_t ldy = p.n + 3;
  std::vector<float> y(size_t(m * ldy), kSentinel);
  const uint16_t* x = p.x.data() + i0 * p.ldx;
  if (packed)
    T.gemm_bf16_packed(x, p.ldx, p.wp.data(), p.k, y.data(), ldy, m, n0, n1);
  else
    T.gemm_bf16(x, p.ldx, p.w.data(), p.k, y.data(), ldy, m, n0, n1);
  return y;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void check_matches_reference(const KernelTable& T, bool bitwise) {
  const int64_t ks[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 255, 256, 257, 300, 577, 1536};
  const int64_t ms[] = {1, 2, 3, 5, 9, 12, 13, 31};
  const int64_t ns[] = {1, 5, 16, 17, 33, 130, 300};
  uint32_t seed = 1;
  for (int64_t k : ks)
    for (int64_t m : ms) {
      const int64_t n = ns[seed % 7];
      Problem p = make_problem(m, n, k, seed++, T);
      const int64_t n0 = seed % 3 == 0 ? 0 : int64_t(seed % uint32_t(n)), n1 = n;
      const int64_t ldy = n + 3;
      std::vector<float> ref(size_t(m * ldy), kSentinel);
      ref::gemm_bf16(p.x.data(), p.ldx, p.w.data(), k, ref.data(), ldy, m, n0, n1);
      for (bool packed : {false, true}) {
        auto y = run(T, p, packed, 0, m, n0, n1);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < ldy; ++j) {
            const float got = y[size_t(i * ldy + j)], want = ref[size_t(i * ldy + j)];
            if (j < n0 || j >= n1) {
              ASSERT_EQ(got, kSentinel) << "wrote outside [n0, n1) at i=" << i << " j=" << j;
              continue;
            }
            if (bitwise) {
              ASSERT_TRUE(same_bits(got, want))
                  << "m=" << m << " n=" << n << " k=" << k << " i=" << i << " j=" << j
                  << " packed=" << packed << " got " << got << " want " << want;
            } else {
              double abs_sum = 0;
              for (int64_t c = 0; c < k; ++c)
                abs_sum += std::fabs(double(bf16_to_f32(p.x[size_t(i * p.ldx + c)])) *
                                     bf16_to_f32(p.w[size_t(j * k + c)]));
              ASSERT_LE(std::fabs(double(got) - want), 2.0 * double(k) * 0x1p-24 * abs_sum)
                  << "m=" << m << " n=" << n << " k=" << k << " i=" << i << " j=" << j;
            }
          }
      }
    }
}

TEST_P(KernelGemmTest, MatchesReference) {
  check_matches_reference(T(), GetParam() != Isa::Avx512Bf16);
}

TEST_P(KernelGemmTest, PackMatchesReferencePacker) {
  for (int64_t n : {1, 15, 16, 17, 40}) {
    for (int64_t k : {1, 2, 5, 31, 32, 33, 64, 577}) {
      auto w = random_bf16(size_t(n * k), -2.f, 2.f, uint32_t(n * 1000 + k));
      std::vector<uint16_t> a(size_t(gemm_bf16_packed_size(n, k)), 0xaaaa), b = a;
      ref::pack_bf16(w.data(), n, k, a.data());
      T().pack_bf16(w.data(), n, k, b.data());
      ASSERT_EQ(a, b) << "n=" << n << " k=" << k;
    }
  }
}

// y[i, j] must be bitwise the same whatever m, n0, n1 (and whichever tile or
// block of the kernel it falls in), for plain and packed weights alike, and
// the two entries must agree with each other.
void check_batch_invariance(const KernelTable& T) {
  for (int64_t k : {7, 64, 300, 577}) {
    const int64_t m = 29, n = 333;  // several W blocks for every ISA, plain and packed
    Problem p = make_problem(m, n, k, uint32_t(k), T);
    const int64_t ldy = n + 3;
    const auto full = run(T, p, false, 0, m, 0, n);
    ASSERT_EQ(full, run(T, p, true, 0, m, 0, n)) << "packed != plain, k=" << k;
    std::mt19937 rng{uint32_t(k)};
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t i0 = int64_t(rng() % uint32_t(m));
      const int64_t mm = trial < 10 ? 1 : 1 + int64_t(rng() % uint32_t(m - i0));
      int64_t n0 = int64_t(rng() % uint32_t(n)), n1 = n0 + 1 + int64_t(rng() % uint32_t(n - n0));
      if (trial % 4 == 0) n0 = n0 / 64 * 64;  // thread-style split points
      const bool packed = trial % 2 == 1;
      const auto part = run(T, p, packed, i0, mm, n0, n1);
      for (int64_t i = 0; i < mm; ++i)
        for (int64_t j = n0; j < n1; ++j)
          ASSERT_TRUE(same_bits(part[size_t(i * ldy + j)], full[size_t((i0 + i) * ldy + j)]))
              << "k=" << k << " row " << i0 + i << " col " << j << " in m=" << mm << " [" << n0
              << ", " << n1 << ") packed=" << packed;
    }
  }
}

TEST_P(KernelGemmTest, BatchInvariantAcrossSplits) { check_batch_invariance(T()); }

// The avx512bf16 GEMM's code with VDPBF16PS replaced by two FMAs (same pair
// order as the instruction's definition); same tolerance as avx512bf16.
TEST(KernelGemmEmulatedBf16, TilingMatchesReferenceAndIsBatchInvariant) {
  const KernelTable* base = table_for(Isa::Avx512);
  if (!base) GTEST_SKIP() << "needs AVX-512 F/BW/VL/DQ";
  KernelTable t = *base;
  t.gemm_bf16 = avx512bf16_emulated::gemm_bf16;
  t.gemm_bf16_packed = avx512bf16_emulated::gemm_bf16_packed;
  check_matches_reference(t, false);
  check_batch_invariance(t);
}

TEST_P(KernelGemmTest, PeakProbeRuns) {
  EXPECT_GT(T().peak_flops_per_iter, 0);
  EXPECT_TRUE(std::isfinite(T().peak_probe(1000)));
}

INSTANTIATE_TEST_SUITE_P(KernelIsa, KernelGemmTest, ::testing::ValuesIn(kAllIsas), isa_param_name);

}  // namespace
}  // namespace kvant::kernels::test
