// Group-wise RTN INT4 (numerics/int4_rtn.h): the error bounds stated there on random
// matrices, exact reproduction of values already on the grid, the sign rule
// (a group's largest magnitude maps to -8), all-zero groups, asymmetric
// zero points.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "numerics/bf16.h"
#include "numerics/int4_rtn.h"

namespace kvant {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 0.02f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

float bf16r(float x) { return bf16_to_f32(f32_to_bf16(x)); }

TEST(QuantRtn, SymmetricWithinStatedBound) {
  for (int group : {32, 64, 128}) {
    const int64_t rows = 37, cols = 256;
    auto w = gaussian(rows * cols, uint32_t(group));
    const Int4Weight q = rtn_quantize(w.data(), rows, cols, group, false);
    EXPECT_TRUE(q.zero.empty());
    std::vector<float> back(w.size());
    dequantize(q, back.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = size_t(r * cols + c);
        const float d = std::fabs(q.scale[size_t(r * (cols / group) + c / group)]);
        ASSERT_GE(q.q[i], -8);
        ASSERT_LE(q.q[i], 7);
        const float err = std::fabs(w[i] - back[i]);
        // |d0|/2 from rounding plus |q| |d - d0| from storing d in BF16
        // (|d - d0| <= 2^-9 |d0|) unless clipped; clipped elements stay
        // within 1.032 |d|.
        if (q.q[i] != 7) {
          EXPECT_LE(err, (0.5f + 8.f / 512.f) * d * 1.0001f) << r << "," << c;
        }
        EXPECT_LE(err, 1.032f * d) << r << "," << c;
      }
    // Gaussian weights: 4-bit symmetric RTN keeps the relative RMS error near 0.1.
    const QuantError e = quant_error(w.data(), back.data(), int64_t(w.size()));
    EXPECT_LT(e.rel_rms, group == 32 ? 0.11 : 0.13) << group;
    EXPECT_GT(e.rel_rms, 0.03);
  }
}

TEST(QuantRtn, LargestMagnitudeMapsToMinusEightWhateverItsSign) {
  // m = +1 gives d = -0.125: +1 -> -8 exactly, -1 -> +8 clips to 7 (reads back -0.875).
  std::vector<float> w = {1.f, -1.f, 0.5f, 0.f, -0.25f, 0.125f, 0.f, 0.f};
  const Int4Weight q = rtn_quantize(w.data(), 1, 8, 8, false);
  EXPECT_EQ(q.scale[0], -0.125f);
  EXPECT_EQ(q.q, (std::vector<int8_t>{-8, 7, -4, 0, 2, -1, 0, 0}));
  std::vector<float> back(8);
  dequantize(q, back.data());
  EXPECT_EQ(back[1], -0.875f);
  // m negative: d positive, -1 -> -8 and +1 clips to 7 the same way.
  for (auto& x : w) x = -x;
  const Int4Weight n = rtn_quantize(w.data(), 1, 8, 8, false);
  EXPECT_EQ(n.scale[0], 0.125f);
  EXPECT_EQ(n.q[0], -8);
  EXPECT_EQ(n.q[1], 7);
}

TEST(QuantRtn, ValuesOnTheGridAreReproducedExactly) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> qd(-7, 7);
  std::uniform_real_distribution<float> sd(1e-4f, 1.f);
  const int64_t rows = 9, cols = 96, group = 32, groups = cols / group;
  std::vector<float> scale(size_t(rows * groups)), w(size_t(rows * cols));
  std::vector<int8_t> qs(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float d = bf16r(sd(rng)) * ((r + g) % 2 ? 1.f : -1.f);
      scale[size_t(r * groups + g)] = d;
      for (int64_t k = 0; k < group; ++k) {
        const int q = k == (r + g) % group ? -8 : qd(rng);  // one -8 per group sets the scale
        qs[size_t(r * cols + g * group + k)] = int8_t(q);
        w[size_t(r * cols + g * group + k)] = float(q) * d;
      }
    }
  const Int4Weight q = rtn_quantize(w.data(), rows, cols, int(group), false);
  EXPECT_EQ(q.scale, scale);
  EXPECT_EQ(q.q, qs);
  std::vector<float> back(w.size());
  dequantize(q, back.data());
  EXPECT_EQ(back, w);
}

TEST(QuantRtn, AllZeroGroups) {
  std::vector<float> w(64, 0.f);
  w[40] = 3.f;  // second group is not zero
  for (bool asym : {false, true}) {
    const Int4Weight q = rtn_quantize(w.data(), 1, 64, 32, asym);
    EXPECT_EQ(q.scale[0], 0.f);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(q.q[size_t(i)], 0);
    if (asym) {
      EXPECT_EQ(q.zero[0], 0);
    }
    std::vector<float> back(64);
    dequantize(q, back.data());
    for (int i = 0; i < 32; ++i) EXPECT_EQ(back[size_t(i)], 0.f) << i << " asym=" << asym;
    // Symmetric: 3 is the group's extreme and maps to -8 exactly.
    if (!asym) {
      EXPECT_EQ(back[40], 3.f);
    }
  }
}

TEST(QuantRtn, AsymmetricWithinStatedBound) {
  const int64_t rows = 21, cols = 128;
  auto w = gaussian(rows * cols, 9);
  // Shift some rows so groups are one-signed: zero must then sit at the range's edge.
  for (int64_t c = 0; c < cols; ++c) {
    w[size_t(1 * cols + c)] = std::fabs(w[size_t(1 * cols + c)]) + 0.05f;
    w[size_t(2 * cols + c)] = -std::fabs(w[size_t(2 * cols + c)]) - 0.05f;
  }
  for (int group : {32, 128}) {
    const Int4Weight q = rtn_quantize(w.data(), rows, cols, group, true);
    ASSERT_EQ(q.zero.size(), q.scale.size());
    std::vector<float> back(w.size());
    dequantize(q, back.data());
    const int64_t groups = cols / group;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = size_t(r * cols + c), gi = size_t(r * groups + c / group);
        EXPECT_GT(q.scale[gi], 0.f);
        EXPECT_LE(std::fabs(w[i] - back[i]), 0.6f * q.scale[gi]) << r << "," << c;
      }
    // All-positive groups: lo = 0, so zero = -8; all-negative: hi = 0, zero = 7.
    EXPECT_EQ(q.zero[size_t(1 * groups)], -8);
    EXPECT_EQ(q.zero[size_t(2 * groups)], 7);
    const QuantError e = quant_error(w.data(), back.data(), int64_t(w.size()));
    EXPECT_LT(e.rel_rms, group == 32 ? 0.1 : 0.13);
  }
}

TEST(QuantRtn, ErrorStatistics) {
  std::vector<float> a = {3.f, 4.f}, b = {3.f, 3.f};
  const QuantError e = quant_error(a.data(), b.data(), 2);
  EXPECT_DOUBLE_EQ(e.max_abs, 1.0);
  EXPECT_DOUBLE_EQ(e.rms, std::sqrt(0.5));
  EXPECT_DOUBLE_EQ(e.rel_rms, std::sqrt(0.5) / std::sqrt(12.5));
}

// The clip search (int4_group_params_clipped): never worse than the plain
// rule under its own weighted error, equal to it where shrinking cannot help
// (values on the grid), and it does shrink a group with one outlier.
TEST(QuantRtn, ClippedGroupsNeverLoseToPlainOnes) {
  auto err = [](const std::vector<float>& w, const float* h, const Int4GroupParams& p, bool asym) {
    double e = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const double d = w[i] - double(int4_code(w[i], p, asym) - p.zero) * p.scale;
      e += (h ? h[i] : 1.0) * d * d;
    }
    return e;
  };
  int shrunk = 0;
  for (uint32_t seed = 0; seed < 40; ++seed)
    for (bool asym : {false, true}) {
      auto w = gaussian(128, 100 + seed);
      const auto h = gaussian(128, 200 + seed, 1.f);
      std::vector<float> hw(h.size());
      for (size_t i = 0; i < h.size(); ++i) hw[i] = h[i] * h[i];
      const float* hp = seed % 2 ? hw.data() : nullptr;
      const Int4GroupParams plain = int4_group_params(w.data(), 128, asym);
      const Int4GroupParams clip = int4_group_params_clipped(w.data(), hp, 128, asym);
      EXPECT_LE(err(w, hp, clip, asym), err(w, hp, plain, asym)) << seed << " " << asym;
      EXPECT_EQ(clip.scale, bf16r(clip.scale));
      if (clip.scale != plain.scale) ++shrunk;
      EXPECT_LE(std::fabs(clip.scale), std::fabs(plain.scale));
    }
  EXPECT_GT(shrunk, 40);  // Gaussian groups of 128: the tails are worth clipping
  // One outlier among small values: its range is cut.
  std::vector<float> o(128, 0.f);
  for (int i = 0; i < 128; ++i) o[size_t(i)] = 0.01f * float((i * 37) % 15 - 7) / 7.f;
  o[5] = -0.05f;
  const Int4GroupParams po = int4_group_params_clipped(o.data(), nullptr, 128, false);
  EXPECT_LT(std::fabs(po.scale), 0.05f / 8.f);
  // Values on the plain grid: nothing to gain, the plain parameters stay.
  std::vector<float> g(64);
  for (int i = 0; i < 64; ++i) g[size_t(i)] = 0.125f * float(i % 16 - 8);
  const Int4GroupParams pg = int4_group_params(g.data(), 64, false);
  const Int4GroupParams cg = int4_group_params_clipped(g.data(), nullptr, 64, false);
  EXPECT_EQ(cg.scale, pg.scale);
  EXPECT_EQ(err(g, nullptr, cg, false), 0.0);
}

// Whole matrices: each group as int4_group_params_clipped makes it (a short
// last group included), and the weighted error never above plain RTN's.
TEST(QuantRtn, ClippedMatrixIsPerGroupClipping) {
  const int64_t rows = 6, cols = 160, group = 64;
  const auto w = gaussian(rows * cols, 301);
  std::vector<float> h(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) h[size_t(c)] = 1.f + float(c % 9);
  for (bool asym : {false, true}) {
    const Int4Weight q = rtn_quantize_clipped(w.data(), rows, cols, group, asym, h.data());
    const Int4Weight r = rtn_quantize(w.data(), rows, cols, group, asym);
    std::vector<float> bq(w.size()), br(w.size());
    dequantize(q, bq.data());
    dequantize(r, br.data());
    double eq = 0, er = 0;
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t g = 0; g * group < cols; ++g) {
        const int64_t c0 = g * group, n = std::min(group, cols - c0);
        const Int4GroupParams p =
            int4_group_params_clipped(w.data() + row * cols + c0, h.data() + c0, int(n), asym);
        EXPECT_EQ(q.scale[size_t(row * 3 + g)], p.scale);
        for (int64_t c = c0; c < c0 + n; ++c) {
          const size_t i = size_t(row * cols + c);
          EXPECT_EQ(q.q[i], int4_code(w[i], p, asym));
          eq += h[size_t(c)] * (w[i] - bq[i]) * (w[i] - bq[i]);
          er += h[size_t(c)] * (w[i] - br[i]) * (w[i] - br[i]);
        }
      }
    EXPECT_LT(eq, er) << asym;
  }
}

}  // namespace
}  // namespace kvant
