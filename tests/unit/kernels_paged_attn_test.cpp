// paged_attn_decode (kernels.h) on every ISA against the scalar reference, and
// the reference against a double-precision computation from dequantized
// values. Pages are built here by hand (kernels do not know the page pool):
// two KV heads per token row, head 1 read, so the token stride and scale
// stride are not trivial; every page is its own allocation of page_tokens
// slots and the last one is partly filled.
//
// Tolerances, with A[h, d] = sum_t p[h, t] |dequant(V_t)[d]| (double):
//   ISA vs reference        |dout| <= 2e-5 A  (FP32 lane sums vs double dots,
//                           shifting scores by ~1e-6 relative before exp)
//   reference vs double     |dout| <= 2e-5 A  (FP32 scores, probabilities and
//                           the sequential FP32 FMA sum over t)
// Bitwise: BF16 pages equal attn_scores + softmax + attn_weighted_sum of the
// same ISA; a one-token context decodes all 256 FP8 codes exactly as
// numerics/fp8.h's tables on every ISA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ref/ref.h"
#include "kernels_test_util.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant::kernels {
namespace {

using test::KernelIsaTest;
using test::random_f32;

// Row layout [kv_heads, head_dim] (2 unless a test asks otherwise), the last
// head read: token and scale strides are not trivial.
constexpr int64_t kDefaultKvHeads = 2;

int64_t elem_bytes(KvDType e) { return e == KvDType::kBf16 ? 2 : 1; }

float fp8_max(KvDType e) { return e == KvDType::kFp8E4m3 ? kFp8E4m3Max : kFp8E5m2Max; }

uint8_t encode(KvDType e, float x) {
  return e == KvDType::kFp8E4m3 ? f32_to_fp8_e4m3(x) : f32_to_fp8_e5m2(x);
}

double decode(KvDType e, const uint8_t* row, int64_t d) {
  if (e == KvDType::kFp8E4m3) return fp8_e4m3_to_f32(row[d]);
  if (e == KvDType::kFp8E5m2) return fp8_e5m2_to_f32(row[d]);
  uint16_t h;
  std::memcpy(&h, row + 2 * d, 2);
  return bf16_to_f32(h);
}

enum class Scales { kNone, kStatic, kDynamic };

// Random K and V for n tokens in pages of page_tokens slots.
struct Pages {
  KvDType elem;
  int64_t hd, page_tokens, n;
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<std::vector<uint16_t>> ks, vs;  // BF16 scale bits, as pages store them
  std::vector<const uint8_t*> kp, vp;
  std::vector<const uint16_t*> ksp, vsp;
  PagedKv view;

  int64_t kHeads, kHead;

  Pages(KvDType e, Scales sc, int64_t head_dim, int64_t pt, int64_t n_tokens, bool shared,
        uint32_t seed, int64_t kv_heads = kDefaultKvHeads)
      : elem(e), hd(head_dim), page_tokens(pt), n(n_tokens), kHeads(kv_heads), kHead(kv_heads - 1) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> val(-2.f, 2.f), mag(0.1f, 4.f);
    const int64_t eb = elem_bytes(e), stride = kHeads * hd * eb;
    const int64_t pages = (n + pt - 1) / pt;
    const float static_k = 2.5f / (e == KvDType::kBf16 ? 1.f : fp8_max(e));
    const float static_v = 3.f / (e == KvDType::kBf16 ? 1.f : fp8_max(e));
    auto fill = [&](std::vector<std::vector<uint8_t>>& blocks,
                    std::vector<std::vector<uint16_t>>& sc_v, float static_s) {
      blocks.assign(size_t(pages), std::vector<uint8_t>(size_t(pt * stride), 0xA5));
      sc_v.assign(size_t(pages), std::vector<uint16_t>(size_t(pt * kHeads), f32_to_bf16(-1.f)));
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> x(size_t(kHeads * hd));
        const float m = mag(rng);  // per-token magnitude, so dynamic scales differ
        for (auto& xi : x) xi = val(rng) * m;
        uint8_t* row = blocks[size_t(t / pt)].data() + (t % pt) * stride;
        for (int64_t h = 0; h < kHeads; ++h) {
          float amax = 0;
          for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[size_t(h * hd + d)]));
          // Dynamic scales are BF16 values (rounded to nearest here; any
          // BF16 value is a valid scale for the kernel).
          const float s = sc == Scales::kDynamic ? bf16_to_f32(f32_to_bf16(amax / fp8_max(e))) : static_s;
          sc_v[size_t(t / pt)][size_t((t % pt) * kHeads + h)] = f32_to_bf16(s);
          for (int64_t d = 0; d < hd; ++d) {
            const float xi = x[size_t(h * hd + d)];
            if (e == KvDType::kBf16) {
              const uint16_t b = f32_to_bf16(xi);
              std::memcpy(row + (h * hd + d) * 2, &b, 2);
            } else {
              row[h * hd + d] = encode(e, xi / s);
            }
          }
        }
      }
    };
    fill(k, ks, static_k);
    if (!shared) fill(v, vs, static_v);
    for (int64_t p = 0; p < pages; ++p) {
      kp.push_back(k[size_t(p)].data() + kHead * hd * eb);
      vp.push_back((shared ? k : v)[size_t(p)].data() + kHead * hd * eb);
      ksp.push_back(ks[size_t(p)].data() + kHead);
      vsp.push_back((shared ? ks : vs)[size_t(p)].data() + kHead);
    }
    view.k_pages = kp.data();
    view.v_pages = vp.data();
    view.token_stride = stride;
    view.scale_stride = kHeads;
    if (sc == Scales::kDynamic) {
      view.k_scales = ksp.data();
      view.v_scales = vsp.data();
    }
    view.k_scale = static_k;
    view.v_scale = shared ? static_k : static_v;
    view.page_tokens = pt;
    view.n_tokens = n;
    view.elem = e;
  }

  const uint8_t* krow(int64_t t) const {
    return kp[size_t(t / page_tokens)] + (t % page_tokens) * view.token_stride;
  }
  const uint8_t* vrow(int64_t t) const {
    return vp[size_t(t / page_tokens)] + (t % page_tokens) * view.token_stride;
  }
  double kscale(int64_t t) const {
    if (elem == KvDType::kBf16) return 1;
    return view.k_scales ? bf16_to_f32(ksp[size_t(t / page_tokens)][(t % page_tokens) * kHeads]) : view.k_scale;
  }
  double vscale(int64_t t) const {
    if (elem == KvDType::kBf16) return 1;
    return view.v_scales ? bf16_to_f32(vsp[size_t(t / page_tokens)][(t % page_tokens) * kHeads]) : view.v_scale;
  }
};

// Double-precision attention from dequantized values: exact[h * hd + d], and
// A (see the file comment) in bound.
void exact_attention(const Pages& pg, const std::vector<float>& q, int64_t group, double scale,
                     std::vector<double>& exact, std::vector<double>& bound) {
  const int64_t n = pg.n, hd = pg.hd;
  exact.assign(size_t(group * hd), 0);
  bound.assign(size_t(group * hd), 0);
  for (int64_t h = 0; h < group; ++h) {
    std::vector<double> s(static_cast<size_t>(n));
    double mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      for (int64_t d = 0; d < hd; ++d)
        acc += double(q[size_t(h * hd + d)]) * decode(pg.elem, pg.krow(t), d) * pg.kscale(t);
      s[size_t(t)] = acc * scale;
      mx = std::max(mx, s[size_t(t)]);
    }
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int64_t t = 0; t < n; ++t) {
      const double p = s[size_t(t)] / sum;
      for (int64_t d = 0; d < hd; ++d) {
        const double v = decode(pg.elem, pg.vrow(t), d) * pg.vscale(t);
        exact[size_t(h * hd + d)] += p * v;
        bound[size_t(h * hd + d)] += p * std::fabs(v);
      }
    }
  }
}

struct Case {
  int64_t page_tokens, n, group;
};
// Token counts on and off the SIMD token blocks (8 and 16), a single token,
// pages that split blocks (1, 7) or hold several (32, 64), groups 1..9 (AVX2
// scores take 4 heads a pass, AVX-512 8).
constexpr Case kCases[] = {{1, 5, 2},   {7, 37, 3},  {16, 300, 8}, {64, 130, 5}, {16, 16, 1},
                           {32, 70, 9}, {16, 1, 3},  {16, 33, 4},  {16, 50, 6},  {7, 40, 7}};

struct Mode {
  KvDType elem;
  Scales scales;
  const char* name;
};
constexpr Mode kModes[] = {{KvDType::kBf16, Scales::kNone, "bf16"},
                           {KvDType::kFp8E4m3, Scales::kStatic, "e4m3/static"},
                           {KvDType::kFp8E4m3, Scales::kDynamic, "e4m3/dynamic"},
                           {KvDType::kFp8E5m2, Scales::kStatic, "e5m2/static"},
                           {KvDType::kFp8E5m2, Scales::kDynamic, "e5m2/dynamic"}};

constexpr double kTol = 2e-5;

class PagedAttnTest : public KernelIsaTest {};

// Head dims: multiples of 64 (FP8 SIMD reads rows in 64-code blocks), 80 and
// 96 (a partial block), 576 (MLA).
TEST_P(PagedAttnTest, MatchesReference) {
  uint32_t seed = 1;
  double worst = 0;
  for (int64_t hd : {64, 80, 96, 128, 256, 576})
    for (const Mode& mode : kModes)
      for (const Case& c : kCases) {
        const bool shared = hd == 576;  // MLA: one latent row is K and V
        // KV heads per row 1..5: dynamic scales strided by 1..5 floats.
        const int64_t kv_heads = 1 + int64_t(++seed % 5);
        Pages pg(mode.elem, mode.scales, hd, c.page_tokens, c.n, shared, seed, kv_heads);
        const auto q = random_f32(size_t(c.group * hd), -1.f, 1.f, ++seed);
        const float scale = 1.f / std::sqrt(float(hd));
        std::vector<float> want(size_t(c.group * hd)), got(want.size(), NAN);
        std::vector<float> s_want(size_t(c.group * c.n)), s_got(s_want.size());
        ref::paged_attn_decode(q.data(), c.group, hd, scale, pg.view, s_want.data(), want.data());
        T().paged_attn_decode(q.data(), c.group, hd, scale, pg.view, s_got.data(), got.data());
        std::vector<double> exact, bound;
        exact_attention(pg, q, c.group, scale, exact, bound);
        for (size_t i = 0; i < want.size(); ++i) {
          const double a = bound[i] + 1e-30;
          ASSERT_LE(std::fabs(double(got[i]) - want[i]), kTol * a)
              << mode.name << " hd=" << hd << " page=" << c.page_tokens << " n=" << c.n
              << " group=" << c.group << " i=" << i;
          ASSERT_LE(std::fabs(double(want[i]) - exact[i]), kTol * a)
              << "reference vs double: " << mode.name << " hd=" << hd << " n=" << c.n << " i=" << i;
          worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / a);
        }
      }
  RecordProperty("worst_rel_error", std::to_string(worst));
  std::printf("[ %s ] worst |isa - ref| / A = %.3g\n", isa_name(GetParam()), worst);
}

// A head's result does not depend on the heads computed beside it: the
// backend splits a KV head's query heads into smaller blocks when there are
// few sequences, so one call of `group` heads must equal `group` calls of one.
TEST_P(PagedAttnTest, HeadsIndependentOfGroup) {
  uint32_t seed = 900;
  for (int64_t hd : {64, 80, 128, 576})
    for (const Mode& mode : kModes)
      for (const Case& c : kCases) {
        const bool shared = hd == 576;
        Pages pg(mode.elem, mode.scales, hd, c.page_tokens, c.n, shared, ++seed);
        const auto q = random_f32(size_t(c.group * hd), -1.f, 1.f, ++seed);
        const float scale = 1.f / std::sqrt(float(hd));
        std::vector<float> all(static_cast<size_t>(c.group * hd)), one(static_cast<size_t>(hd));
        std::vector<float> s_all(static_cast<size_t>(c.group * c.n)), s_one(static_cast<size_t>(c.n));
        T().paged_attn_decode(q.data(), c.group, hd, scale, pg.view, s_all.data(), all.data());
        for (int64_t h = 0; h < c.group; ++h) {
          T().paged_attn_decode(q.data() + h * hd, 1, hd, scale, pg.view, s_one.data(), one.data());
          ASSERT_EQ(0, std::memcmp(one.data(), all.data() + h * hd, size_t(hd) * 4))
              << mode.name << " hd=" << hd << " n=" << c.n << " group=" << c.group << " head " << h;
        }
      }
}

// The three passes, taken apart as the backend does when it splits one long
// context over threads (scores page-aligned part by part into a wider scratch
// row, probabilities per head, the sum over d ranges split at multiples of
// 32), give paged_attn_decode's bits. NaN codes included (e4m3).
TEST_P(PagedAttnTest, PassesSplitEqualDecode) {
  uint32_t seed = 1300;
  for (int64_t hd : {64, 80, 96, 128, 576})
    for (const Mode& mode : kModes)
      for (const Case& c : kCases) {
        const bool shared = hd == 576;
        Pages pg(mode.elem, mode.scales, hd, c.page_tokens, c.n, shared, ++seed, 3);
        if (mode.elem == KvDType::kFp8E4m3 && c.n > 3) {  // a NaN code in K and one in V
          const_cast<uint8_t*>(pg.krow(c.n / 2))[hd / 3] = 0x7f;
          if (!shared) const_cast<uint8_t*>(pg.vrow(c.n / 3))[hd - 1] = 0xff;
        }
        const auto q = random_f32(size_t(c.group * hd), -1.f, 1.f, ++seed);
        const float scale = 1.f / std::sqrt(float(hd));
        std::vector<float> want(size_t(c.group * hd)), got(want.size(), 7.f);
        std::vector<float> s_want(size_t(c.group * c.n));
        T().paged_attn_decode(q.data(), c.group, hd, scale, pg.view, s_want.data(), want.data());
        // Scores in parts of a few pages each, rows of lds > n floats.
        const int64_t lds = c.n + 5, pt = c.page_tokens;
        std::vector<float> s(size_t(c.group * lds), -3.f);
        const int64_t part_pages = 1 + int64_t(seed % 3);
        for (int64_t p0 = 0; p0 * pt < c.n; p0 += part_pages) {
          PagedKv part = pg.view;
          part.k_pages += p0;
          part.v_pages += p0;
          if (part.k_scales) part.k_scales += p0, part.v_scales += p0;
          part.n_tokens = std::min(c.n - p0 * pt, part_pages * pt);
          T().paged_attn_scores(q.data(), c.group, hd, scale, part, s.data() + p0 * pt, lds);
        }
        for (int64_t h = 0; h < c.group; ++h) T().paged_attn_probs(s.data() + h * lds, lds, 1, pg.view);
        for (int64_t d0 = 0; d0 < hd; d0 += 32)
          T().paged_attn_wsum(s.data(), lds, c.group, hd, pg.view, d0, std::min<int64_t>(d0 + 32, hd),
                              got.data());
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
            << mode.name << " hd=" << hd << " page=" << pt << " n=" << c.n << " group=" << c.group;
        // And whole: one call each.
        std::vector<float> s2(size_t(c.group * c.n)), got2(want.size(), 7.f);
        T().paged_attn_scores(q.data(), c.group, hd, scale, pg.view, s2.data(), c.n);
        T().paged_attn_probs(s2.data(), c.n, c.group, pg.view);
        T().paged_attn_wsum(s2.data(), c.n, c.group, hd, pg.view, 0, hd, got2.data());
        ASSERT_EQ(0, std::memcmp(got2.data(), want.data(), want.size() * 4))
            << "whole: " << mode.name << " hd=" << hd << " n=" << c.n << " group=" << c.group;
      }
}

// A head too wide for the SIMD kernels' stack copy of q (8192 floats) takes
// their plain path.
TEST_P(PagedAttnTest, VeryWideHeadMatchesReference) {
  uint32_t seed = 50;
  const int64_t hd = 8200;
  for (const Mode& mode : kModes) {
    Pages pg(mode.elem, mode.scales, hd, 16, 37, false, ++seed);
    const int64_t group = 2;
    const auto q = random_f32(size_t(group * hd), -1.f, 1.f, ++seed);
    const float scale = 1.f / std::sqrt(float(hd));
    std::vector<float> want(size_t(group * hd)), got(want.size(), NAN);
    std::vector<float> s_want(size_t(group * pg.n)), s_got(s_want.size());
    ref::paged_attn_decode(q.data(), group, hd, scale, pg.view, s_want.data(), want.data());
    T().paged_attn_decode(q.data(), group, hd, scale, pg.view, s_got.data(), got.data());
    std::vector<double> exact, bound;
    exact_attention(pg, q, group, scale, exact, bound);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_LE(std::fabs(double(got[i]) - want[i]), kTol * (bound[i] + 1e-30))
          << mode.name << " i=" << i;
  }
}

// ref::paged_attn_decode's steps with another softmax (what a NaN score turns
// into is the softmax's business, and SIMD softmaxes differ from the scalar one).
void reference_with_softmax(const Pages& pg, const std::vector<float>& q, int64_t group,
                            float scale, void (*softmax)(float*, int64_t), std::vector<float>& out) {
  const int64_t n = pg.n, hd = pg.hd;
  std::vector<float> p(size_t(group * n));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < group; ++h) {
      double acc = 0;
      for (int64_t d = 0; d < hd; ++d)
        acc += double(q[size_t(h * hd + d)]) * decode(pg.elem, pg.krow(t), d);
      p[size_t(h * n + t)] = float(acc * double(scale * float(pg.kscale(t))));
    }
  for (int64_t h = 0; h < group; ++h) softmax(p.data() + h * n, n);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < group; ++h) p[size_t(h * n + t)] *= float(pg.vscale(t));
  out.assign(size_t(group * hd), 0.f);
  for (int64_t h = 0; h < group; ++h)
    for (int64_t d = 0; d < hd; ++d) {
      float acc = 0.f;
      for (int64_t t = 0; t < n; ++t)
        acc = std::fma(p[size_t(h * n + t)], float(decode(pg.elem, pg.vrow(t), d)), acc);
      out[size_t(h * hd + d)] = acc;
    }
}

// A NaN code in one K row (that token's scores are NaN) or one V row (that
// element of every head's output is NaN) gives NaN exactly where the
// reference steps with this ISA's softmax do, and matches them elsewhere.
// Codes at the first and the last element of a row, 64-code blocks full and
// partial.
TEST_P(PagedAttnTest, Fp8NanCodesMatchReference) {
  uint32_t seed = 300;
  for (KvDType e : {KvDType::kFp8E4m3, KvDType::kFp8E5m2})
    for (Scales sc : {Scales::kStatic, Scales::kDynamic})
      for (int64_t hd : {64, 80, 128})
        for (bool in_k : {true, false})
          for (int64_t d : {int64_t(0), hd - 1}) {
            const int64_t n = 37, group = 3, t = 20;
            Pages pg(e, sc, hd, 16, n, false, ++seed);
            auto& blocks = in_k ? pg.k : pg.v;
            const uint8_t nan_code = e == KvDType::kFp8E4m3 ? 0xff : 0x7e;
            blocks[size_t(t / 16)][size_t((t % 16) * pg.view.token_stride + pg.kHead * hd + d)] =
                nan_code;
            const auto q = random_f32(size_t(group * hd), -1.f, 1.f, ++seed);
            std::vector<float> want, got(size_t(group * hd)), s_got(size_t(group * n));
            reference_with_softmax(pg, q, group, 0.125f, T().softmax, want);
            T().paged_attn_decode(q.data(), group, hd, 0.125f, pg.view, s_got.data(), got.data());
            // Scale of the outputs: max_t |dequant(V_t)[d]| (A's bound; A itself has NaNs).
            std::vector<double> vmax(size_t(hd), 0);
            for (int64_t tt = 0; tt < n; ++tt)
              for (int64_t dd = 0; dd < hd; ++dd) {
                const double v = std::fabs(decode(e, pg.vrow(tt), dd) * pg.vscale(tt));
                if (!std::isnan(v)) vmax[size_t(dd)] = std::max(vmax[size_t(dd)], v);
              }
            int64_t nans = 0;
            for (size_t i = 0; i < want.size(); ++i) {
              const std::string where = std::string(e == KvDType::kFp8E4m3 ? "e4m3" : "e5m2") +
                                        (in_k ? " K" : " V") + " hd=" + std::to_string(hd) +
                                        " d=" + std::to_string(d) + " i=" + std::to_string(i);
              ASSERT_EQ(std::isnan(want[i]), std::isnan(got[i])) << where;
              if (std::isnan(want[i])) {
                ++nans;
                continue;
              }
              ASSERT_LE(std::fabs(double(got[i]) - want[i]), kTol * vmax[i % size_t(hd)]) << where;
            }
            if (!in_k) {
              ASSERT_EQ(nans, group) << "hd=" << hd << " d=" << d;
            }
          }
}

// BF16 pages: bitwise what the unpaged helpers of the same ISA give.
TEST_P(PagedAttnTest, Bf16BitwiseEqualsUnpagedPath) {
  uint32_t seed = 100;
  for (int64_t hd : {64, 80, 96, 128, 256, 576})
    for (const Case& c : kCases) {
      Pages pg(KvDType::kBf16, Scales::kNone, hd, c.page_tokens, c.n, hd == 576, ++seed);
      const auto q = random_f32(size_t(c.group * hd), -1.f, 1.f, ++seed);
      const float scale = 1.f / std::sqrt(float(hd));
      std::vector<uint16_t> k(size_t(c.n * hd)), v(size_t(c.n * hd));
      for (int64_t t = 0; t < c.n; ++t) {
        std::memcpy(&k[size_t(t * hd)], pg.krow(t), size_t(hd * 2));
        std::memcpy(&v[size_t(t * hd)], pg.vrow(t), size_t(hd * 2));
      }
      std::vector<float> want(size_t(c.group * hd)), got(want.size());
      std::vector<float> p(size_t(c.n)), scratch(size_t(c.group * c.n));
      for (int64_t h = 0; h < c.group; ++h) {
        T().attn_scores(q.data() + h * hd, k.data(), hd, c.n, hd, scale, p.data());
        T().softmax(p.data(), c.n);
        T().attn_weighted_sum(p.data(), v.data(), hd, c.n, hd, want.data() + h * hd);
      }
      T().paged_attn_decode(q.data(), c.group, hd, scale, pg.view, scratch.data(), got.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
          << "hd=" << hd << " page=" << c.page_tokens << " n=" << c.n << " group=" << c.group;
    }
}

// One token: p = 1 exactly, so out = fma(v_scale, decode(code), +0) for each
// of the 256 codes, bitwise (NaN codes: NaN; -0 comes out +0, as the FMA sum
// starts from +0).
TEST_P(PagedAttnTest, Fp8DecodesEveryCodeExactly) {
  for (KvDType e : {KvDType::kFp8E4m3, KvDType::kFp8E5m2})
    // Scales of 300 and 1e5 pass the SIMD weighted sums' fold limit (e4m3 2^8,
    // e5m2 2^16: v_fold), so those codes are widened to exact values instead.
    for (float vscale : {1.f, 0.0123f, 300.f, 1e5f, -3.f}) {
      const int64_t hd = 256;
      std::vector<uint8_t> krow(size_t(hd), 0), vrow(static_cast<size_t>(hd));
      for (int64_t d = 0; d < hd; ++d) vrow[size_t(d)] = uint8_t(d);
      const uint8_t* kp[] = {krow.data()};
      const uint8_t* vp[] = {vrow.data()};
      PagedKv kv;
      kv.k_pages = kp;
      kv.v_pages = vp;
      kv.token_stride = hd;
      kv.v_scale = vscale;
      kv.page_tokens = 4;
      kv.n_tokens = 1;
      kv.elem = e;
      const auto q = random_f32(size_t(2 * hd), -1.f, 1.f, 7);
      std::vector<float> out(size_t(2 * hd)), scratch(2);
      T().paged_attn_decode(q.data(), 2, hd, 0.1f, kv, scratch.data(), out.data());
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < hd; ++d) {
          const float dec =
              e == KvDType::kFp8E4m3 ? fp8_e4m3_to_f32(uint8_t(d)) : fp8_e5m2_to_f32(uint8_t(d));
          const float want = std::fma(vscale, dec, 0.f), got = out[size_t(h * hd + d)];
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << "code " << d;
          } else {
            ASSERT_EQ(0, std::memcmp(&want, &got, 4))
                << "code " << d << " got " << got << " want " << want;
          }
        }
    }
}

// Queries past 2^7 (the SIMD scores multiply q by 2^K, K < bias for them)
// and V scales past the probability fold's limit on some tokens (e4m3 2^8,
// e5m2 2^16: those tokens' codes are widened instead, the others folded):
// within the tolerance of the reference, and the split passes keep
// paged_attn_decode's bits.
TEST_P(PagedAttnTest, LargeQueriesAndScalesMatchReference) {
  uint32_t seed = 700;
  for (KvDType e : {KvDType::kFp8E4m3, KvDType::kFp8E5m2})
    for (int64_t hd : {64, 96, 128})
      for (const Case& c : kCases) {
        Pages pg(e, Scales::kDynamic, hd, c.page_tokens, c.n, false, ++seed);
        const float big = e == KvDType::kFp8E4m3 ? 0x1p16f : 0x1p24f;
        for (int64_t t = 0; t < c.n; t += 3) {  // every third token's V scale
          uint16_t* sc = pg.vs[size_t(t / c.page_tokens)].data() + (t % c.page_tokens) * pg.kHeads + pg.kHead;
          *sc = f32_to_bf16(bf16_to_f32(*sc) * big);
        }
        auto q = random_f32(size_t(c.group * hd), -1.f, 1.f, ++seed);
        for (int64_t h = 0; h < c.group; ++h)  // |q| up to 2^6, 2^8, 2^11 by head
          for (int64_t d = 0; d < hd; ++d) q[size_t(h * hd + d)] *= float(64 << (h % 3 * 2 + h % 3 / 2));
        const float scale = 1.f / std::sqrt(float(hd)) / 2048.f;
        std::vector<float> want(size_t(c.group * hd)), got(want.size(), NAN);
        std::vector<float> s_want(size_t(c.group * c.n)), s_got(s_want.size());
        ref::paged_attn_decode(q.data(), c.group, hd, scale, pg.view, s_want.data(), want.data());
        T().paged_attn_decode(q.data(), c.group, hd, scale, pg.view, s_got.data(), got.data());
        std::vector<double> exact, bound;
        exact_attention(pg, q, c.group, scale, exact, bound);
        const std::string where = std::string(e == KvDType::kFp8E4m3 ? "e4m3" : "e5m2") +
                                  " hd=" + std::to_string(hd) + " n=" + std::to_string(c.n) +
                                  " group=" + std::to_string(c.group);
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(std::isfinite(got[i])) << where << " i=" << i;
          ASSERT_LE(std::fabs(double(got[i]) - want[i]), kTol * (bound[i] + 1e-30)) << where << " i=" << i;
        }
        std::vector<float> s(size_t(c.group * c.n)), got2(want.size(), 7.f);
        T().paged_attn_scores(q.data(), c.group, hd, scale, pg.view, s.data(), c.n);
        T().paged_attn_probs(s.data(), c.n, c.group, pg.view);
        T().paged_attn_wsum(s.data(), c.n, c.group, hd, pg.view, 0, hd, got2.data());
        ASSERT_EQ(0, std::memcmp(got2.data(), got.data(), got.size() * 4)) << "split: " << where;
      }
}

TEST_P(PagedAttnTest, EmptyContextGivesZeros) {
  PagedKv kv;
  kv.n_tokens = 0;
  const auto q = random_f32(64 * 3, -1.f, 1.f, 3);
  std::vector<float> out(64 * 3, NAN);
  float scratch = 0;
  T().paged_attn_decode(q.data(), 3, 64, 0.125f, kv, &scratch, out.data());
  for (float x : out) ASSERT_EQ(x, 0.f);
}

INSTANTIATE_TEST_SUITE_P(KernelIsa, PagedAttnTest, ::testing::ValuesIn(kAllIsas),
                         test::isa_param_name);

}  // namespace
}  // namespace kvant::kernels
