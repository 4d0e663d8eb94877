// Sampler and logprob tests, no model: sampled frequencies against the
// truncated, renormalised distribution a direct double-precision
// implementation gives (chi-square at p ~ 3e-7, and tokens outside it never
// drawn); greedy ties; the exact effect of each penalty; seeds; logprobs
// against a direct log-softmax; no heap allocation per step once warm.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <vector>

#include "alloc_counter.h"
#include "engine/logprobs.h"
#include "engine/sampler.h"

// The allocation counter of alloc_counter.h. Replacing the global operator
// new is program-wide, so it only counts and otherwise behaves as the
// default one (malloc/free). GCC, seeing both definitions inlined into
// gtest's new/delete pairs, mistakes the free for a mismatch.
namespace kvant::testing {
std::atomic<bool> g_count_allocs{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace kvant::testing

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (kvant::testing::g_count_allocs.load(std::memory_order_relaxed))
    kvant::testing::g_allocs.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
// AlignedBuffer (core/aligned.h) takes its memory from aligned_alloc: counted
// too, through posix_memalign, which this does not replace.
extern "C" void* aligned_alloc(size_t align, size_t n) {
  if (kvant::testing::g_count_allocs.load(std::memory_order_relaxed))
    kvant::testing::g_allocs.fetch_add(1);
  void* p = nullptr;
  return posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, n ? n : 1) == 0 ? p : nullptr;
}

namespace kvant {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Portable pseudo-random logits in [lo, hi) with 1/1000 resolution, so some
// values repeat and ties get exercised.
std::vector<float> make_logits(size_t n, uint32_t seed, float lo = -5.f, float hi = 5.f) {
  std::mt19937 g(seed);
  std::vector<float> v(n);
  const uint32_t steps = uint32_t((hi - lo) * 1000);
  for (auto& x : v) x = lo + float(g() % steps) / 1000.f;
  return v;
}

// The distribution the sampler should draw from, computed directly: order
// by logit (ties to the lower id), softmax(logits / T), top-k, top-p over the
// renormalised top-k, min-p against the top probability.
std::vector<double> reference_probs(const std::vector<float>& logits, const SamplingParams& p) {
  const size_t n = logits.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  const double mx = logits[order[0]];
  std::vector<double> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = std::exp((double(logits[i]) - mx) / p.temperature);
  size_t keep = n;
  if (p.top_k > 0 && size_t(p.top_k) < n) keep = size_t(p.top_k);
  double zk = 0;
  for (size_t j = 0; j < keep; ++j) zk += q[order[j]];
  if (p.top_p < 1.f) {
    double acc = 0;
    for (size_t j = 0; j < keep; ++j) {
      acc += q[order[j]];
      if (acc >= double(p.top_p) * zk) {
        keep = j + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.f) {
    size_t m = 1;
    while (m < keep && q[order[m]] >= double(p.min_p) * q[order[0]]) ++m;
    keep = m;
  }
  std::vector<double> out(n, 0.0);
  double z = 0;
  for (size_t j = 0; j < keep; ++j) z += q[order[j]];
  for (size_t j = 0; j < keep; ++j) out[order[j]] = q[order[j]] / z;
  return out;
}

std::vector<int64_t> draw_counts(const SamplingParams& p, const std::vector<float>& logits,
                                 int64_t draws) {
  Sampler s(p);
  std::vector<float> row(logits.size());
  std::vector<int64_t> counts(logits.size(), 0);
  for (int64_t i = 0; i < draws; ++i) {
    std::copy(logits.begin(), logits.end(), row.begin());
    ++counts[size_t(s.sample(row))];
  }
  return counts;
}

// Upper chi-square quantile by the Wilson-Hilferty approximation; z = 5 is
// a one-sided tail of about 3e-7.
double chi2_critical(int df, double z = 5.0) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Bins with an expected count under 5 are pooled, as the chi-square
// approximation needs; tokens the reference excludes must never appear.
void expect_distribution(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                         int64_t draws) {
  double chi2 = 0, pool_e = 0, pool_o = 0;
  int bins = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " lies outside the truncated distribution";
      continue;
    }
    const double e = probs[i] * double(draws), o = double(counts[i]);
    if (e < 5.0) {
      pool_e += e;
      pool_o += o;
      continue;
    }
    chi2 += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pool_e >= 5.0) {
    chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++bins;
  } else {
    EXPECT_LE(pool_o, pool_e + 6.0 * std::sqrt(pool_e) + 6.0);
  }
  if (bins >= 2) {
    EXPECT_LT(chi2, chi2_critical(bins - 1)) << bins << " bins";
  }
}

void check_sampling(const SamplingParams& p, const std::vector<float>& logits, int64_t draws) {
  const auto probs = reference_probs(logits, p);
  size_t support = 0;
  for (double x : probs) support += x > 0;
  SCOPED_TRACE(::testing::Message() << "T=" << p.temperature << " top_k=" << p.top_k << " top_p="
                                    << p.top_p << " min_p=" << p.min_p << " support=" << support);
  expect_distribution(draw_counts(p, logits, draws), probs, draws);
}

SamplingParams params(float t, int32_t k, float top_p, float min_p, uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

// ---------------------------------------------------------------- greedy

TEST(SamplerGreedy, TiesGoToTheLowestId) {
  std::vector<float> l = {0.f, 2.f, 5.f, 1.f, 5.f, 5.f};
  Sampler g(params(0.f, 0, 1.f, 0.f));
  EXPECT_EQ(g.sample(l), 2);
  // top_k = 1 is greedy at any temperature.
  Sampler k1(params(1.5f, 1, 1.f, 0.f));
  EXPECT_EQ(k1.sample(l), 2);
  std::vector<float> masked(5, kNegInf);
  EXPECT_EQ(g.sample(masked), 0);
  EXPECT_EQ(Sampler::argmax(std::vector<float>{-1.f, -1.f}), 0);
}

TEST(SamplerGreedy, LogitBiasMovesTheChoice) {
  std::vector<float> l = {0.f, 2.f, 5.f, 1.f};
  SamplingParams p = params(0.f, 0, 1.f, 0.f);
  p.logit_bias = {{2, -100.f}, {3, 3.5f}};  // 5 - 100 and 1 + 3.5: token 3 wins at 4.5
  Sampler g(p);
  std::vector<float> row = l;
  EXPECT_EQ(g.sample(row), 3);
  EXPECT_EQ(row[2], -95.f);  // applied in place: what logprobs see
  EXPECT_EQ(row[3], 4.5f);
  // Sampling at a temperature: +100 on one token takes every draw.
  SamplingParams q = params(1.f, 0, 1.f, 0.f);
  q.seed = 11;
  q.logit_bias = {{0, 100.f}};
  Sampler t(q);
  for (int i = 0; i < 200; ++i) {
    row = l;
    EXPECT_EQ(t.sample(row), 0);
  }
  EXPECT_TRUE(check_sampling_params(p).ok());
  p.logit_bias = {{2, 101.f}};
  EXPECT_FALSE(check_sampling_params(p).ok());
  p.logit_bias = {{2, 1.f}, {2, 2.f}};
  EXPECT_FALSE(check_sampling_params(p).ok());
  p.logit_bias = {{-1, 1.f}};
  EXPECT_FALSE(check_sampling_params(p).ok());
}

TEST(SamplerGreedy, AMaskedRowStillYieldsAToken) {
  std::vector<float> l(10, kNegInf);
  l[7] = 0.f;
  for (auto p : {params(1.f, 0, 1.f, 0.f), params(1.f, 3, 1.f, 0.f), params(1.f, 0, 0.5f, 0.f),
                 params(1.f, 0, 1.f, 0.5f)}) {
    Sampler s(p);
    std::vector<float> row = l;
    EXPECT_EQ(s.sample(row), 7);
  }
}

// ---------------------------------------------------------------- distributions

TEST(SamplerDistribution, Temperature) {
  const auto l = make_logits(64, 1);
  check_sampling(params(0.7f, 0, 1.f, 0.f), l, 100000);
  check_sampling(params(1.f, 0, 1.f, 0.f), l, 100000);
  check_sampling(params(2.5f, 0, 1.f, 0.f), l, 100000);
}

TEST(SamplerDistribution, TopK) {
  const auto l = make_logits(64, 2);
  check_sampling(params(1.3f, 8, 1.f, 0.f), l, 100000);
  check_sampling(params(0.8f, 63, 1.f, 0.f), l, 100000);
}

TEST(SamplerDistribution, TopKTiesAtTheBoundaryKeepTheLowerId) {
  auto l = make_logits(40, 3, -3.f, 0.f);
  // Ranks 1-3 at 2.0 (ids 5, 11, 30), 4-5 tied at 1.0 (ids 9 and 20), top_k 4:
  // id 9 is in, id 20 out.
  for (int id : {5, 11, 30}) l[size_t(id)] = 2.f;
  l[9] = l[20] = 1.f;
  const auto p = params(1.f, 4, 1.f, 0.f);
  const auto probs = reference_probs(l, p);
  EXPECT_GT(probs[9], 0.0);
  EXPECT_EQ(probs[20], 0.0);
  check_sampling(p, l, 50000);
}

TEST(SamplerDistribution, TopP) {
  const auto l = make_logits(64, 4);
  check_sampling(params(0.9f, 0, 0.75f, 0.f), l, 100000);
  check_sampling(params(2.f, 0, 0.95f, 0.f), l, 100000);
  check_sampling(params(0.5f, 0, 0.3f, 0.f), l, 20000);
}

TEST(SamplerDistribution, TopPAppliesToTheTopKDistribution) {
  const auto l = make_logits(64, 5);
  check_sampling(params(1.f, 20, 0.6f, 0.f), l, 100000);
}

TEST(SamplerDistribution, MinP) {
  const auto l = make_logits(64, 6);
  check_sampling(params(1.1f, 0, 1.f, 0.05f), l, 100000);
  check_sampling(params(0.6f, 0, 1.f, 0.3f), l, 50000);
}

TEST(SamplerDistribution, AllTruncationsTogether) {
  const auto l = make_logits(64, 7);
  check_sampling(params(1.f, 30, 0.9f, 0.02f), l, 100000);
  check_sampling(params(1.7f, 0, 0.8f, 0.01f), l, 100000);
}

// A nucleus whose boundary falls inside a long run of equal probabilities
// far below the top token: the boundary bin holds 2048 tied tokens.
TEST(SamplerDistribution, TopPBoundaryInsideALongTie) {
  std::vector<float> l(2049, 10.f);
  l[0] = 20.f;
  const auto p = params(1.f, 0, 0.95f, 0.f);
  const auto probs = reference_probs(l, p);
  size_t support = 0;
  for (double x : probs) support += x > 0;
  ASSERT_GT(support, 500u);  // the top token alone holds ~92%
  ASSERT_LT(support, 2049u);
  check_sampling(p, l, 5000);
}

// Gemma's vocabulary size, shaped like a model's output: a long low tail and
// a few dozen plausible tokens scattered through the ids.
TEST(SamplerDistribution, LargeVocabulary) {
  auto l = make_logits(262144, 8, -20.f, -6.f);
  const auto head = make_logits(60, 9, 4.f, 8.f);
  for (size_t j = 0; j < head.size(); ++j) l[(j * 40503 + 17) % l.size()] = head[j];
  check_sampling(params(1.f, 40, 1.f, 0.f), l, 600);
  check_sampling(params(0.8f, 0, 1.f, 0.05f), l, 600);
  check_sampling(params(1.f, 0, 0.9f, 0.f), l, 600);
}

// ---------------------------------------------------------------- penalties

TEST(SamplerPenalties, ExactEffectOnLogits) {
  SamplingParams p;  // greedy: only the penalties touch the row
  p.repetition_penalty = 1.5f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  const std::vector<int32_t> prompt = {1, 2, 2, 6};
  s.set_prompt(prompt, 16);
  for (int32_t t : {2, 3, 3, 3, 5}) s.accept(t);

  std::vector<float> l = {1.f, 2.f, 3.f, -4.f, 0.5f, -1.f, 0.f, 7.f};
  const std::vector<float> before = l;
  s.sample(l);
  const auto rep = [&](float x) { return x > 0.f ? x / 1.5f : x * 1.5f; };
  EXPECT_EQ(l[0], before[0]);                              // never seen
  EXPECT_EQ(l[1], rep(before[1]));                         // prompt only: repetition only
  EXPECT_EQ(l[2], rep(before[2]) - (0.5f + 0.25f * 1.f));  // prompt and generated once
  EXPECT_EQ(l[3], rep(before[3]) - (0.5f + 0.25f * 3.f));  // negative logit, generated 3x
  EXPECT_EQ(l[4], before[4]);
  EXPECT_EQ(l[5], rep(before[5]) - (0.5f + 0.25f * 1.f));  // generated only
  EXPECT_EQ(l[6], 0.f);                                    // 0 * 1.5 stays 0
  EXPECT_EQ(l[7], before[7]);
}

TEST(SamplerPenalties, PresenceAndFrequencyIgnoreThePrompt) {
  SamplingParams p;
  p.presence_penalty = 1.f;
  p.frequency_penalty = 1.f;
  Sampler s(p);
  s.set_prompt(std::vector<int32_t>{0, 0, 1});
  s.accept(1);
  std::vector<float> l = {3.f, 3.f, 1.f};
  EXPECT_EQ(s.sample(l), 0);
  EXPECT_EQ(l[0], 3.f);
  EXPECT_EQ(l[1], 1.f);
}

TEST(SamplerPenalties, RepetitionSteersGreedyAwayFromSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 2.f;
  Sampler s(p);
  s.set_prompt(std::vector<int32_t>{0});
  std::vector<float> l = {4.f, 3.f};
  EXPECT_EQ(s.sample(l), 1);  // 4 / 2 = 2 < 3
}

TEST(SamplerPenalties, SetPromptForgetsTheLastRequest) {
  SamplingParams p;
  p.frequency_penalty = 1.f;
  Sampler s(p);
  s.set_prompt({});
  for (int i = 0; i < 5; ++i) s.accept(0);
  s.set_prompt({});
  std::vector<float> l = {1.f, 0.f};
  s.sample(l);
  EXPECT_EQ(l[0], 1.f);
}

TEST(SamplerPenalties, ManyDistinctTokensAreCountedExactly) {
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.repetition_penalty = 1.25f;
  Sampler s(p);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 3000; i += 3) prompt.push_back(i);
  s.set_prompt(prompt);  // no reservation: the table grows as tokens arrive
  std::vector<int32_t> count(4096, 0);
  std::mt19937 g(9);
  for (int i = 0; i < 20000; ++i) {
    const int32_t t = int32_t(g() % 4096);
    ++count[size_t(t)];
    s.accept(t);
  }
  std::vector<float> l(4096, 2.f);
  s.sample(l);
  for (int32_t t = 0; t < 4096; ++t) {
    float want = 2.f;
    if (count[size_t(t)] > 0 || (t < 3000 && t % 3 == 0)) want = want / 1.25f;
    if (count[size_t(t)] > 0) want -= 0.5f * float(count[size_t(t)]);
    ASSERT_EQ(l[size_t(t)], want) << "token " << t;
  }
}

// The history overload counts the first call's history as prompt and what is
// appended afterwards as generated: the same as set_prompt + accept.
TEST(SamplerPenalties, HistoryOverloadMatchesExplicitCounting) {
  SamplingParams p = params(0.8f, 0, 0.9f, 0.f, 77);
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.2f;
  Sampler a(p), b(p);
  std::vector<int32_t> history = {3, 1, 4, 1, 5};
  b.set_prompt(history);
  const auto base = make_logits(32, 11);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> la = base, lb = base;
    const int32_t ta = a.sample(la, history);
    const int32_t tb = b.sample(lb);
    ASSERT_EQ(ta, tb) << "step " << step;
    ASSERT_EQ(la, lb);
    history.push_back(ta);
    b.accept(tb);
  }
}

// ---------------------------------------------------------------- seeds

TEST(SamplerSeed, SameSeedSameTokensWhateverRunsBeside) {
  const auto p = params(1.f, 0, 0.95f, 0.f, 42);
  Sampler a(p), b(p), other(params(1.f, 0, 1.f, 0.f, 7));
  std::vector<int32_t> ta, tb;
  for (int step = 0; step < 200; ++step) {
    const auto l = make_logits(100, uint32_t(step));
    std::vector<float> r1 = l, r2 = l, r3 = l;
    ta.push_back(a.sample(r1));
    other.sample(r3);  // interleaved with another request
    if (step % 2) other.sample(r3);
    tb.push_back(b.sample(r2));
  }
  EXPECT_EQ(ta, tb);
  Sampler c(params(1.f, 0, 0.95f, 0.f, 43));
  std::vector<int32_t> tc;
  for (int step = 0; step < 200; ++step) {
    auto l = make_logits(100, uint32_t(step));
    tc.push_back(c.sample(l));
  }
  EXPECT_NE(ta, tc);
}

// ---------------------------------------------------------------- params

TEST(SamplerParams, OutOfRangeValuesAreNamed) {
  EXPECT_TRUE(check_sampling_params(SamplingParams{}).ok());
  const auto err = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    auto r = check_sampling_params(p);
    return r.ok() ? std::string() : r.error().message;
  };
  EXPECT_NE(err([](auto& p) { p.temperature = -1.f; }).find("temperature"), std::string::npos);
  EXPECT_NE(err([](auto& p) { p.top_p = 0.f; }).find("top_p"), std::string::npos);
  EXPECT_NE(err([](auto& p) { p.top_p = 1.5f; }).find("top_p"), std::string::npos);
  EXPECT_NE(err([](auto& p) { p.min_p = -0.1f; }).find("min_p"), std::string::npos);
  EXPECT_NE(err([](auto& p) { p.top_k = -2; }).find("top_k"), std::string::npos);
  EXPECT_NE(err([](auto& p) { p.repetition_penalty = 0.f; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(err([](auto& p) { p.presence_penalty = 2.5f; }).find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(err([](auto& p) { p.frequency_penalty = std::nanf(""); }).find("frequency_penalty"),
            std::string::npos);
  EXPECT_NE(err([](auto& p) { p.top_logprobs = 21; }).find("top_logprobs"), std::string::npos);
  EXPECT_EQ(err([](auto& p) { p.top_k = -1; }), "");
}

// ---------------------------------------------------------------- allocation

TEST(SamplerSteadyState, NoHeapAllocationPerStep) {
  const auto base = make_logits(50000, 12, -8.f, 8.f);
  for (auto p : {params(0.f, 0, 1.f, 0.f), params(0.9f, 40, 0.9f, 0.05f), params(1.f, 0, 0.9f, 0.f),
                 params(1.f, 0, 1.f, 0.f), params(1.f, 0, 1.f, 0.1f)}) {
    p.repetition_penalty = 1.1f;
    p.presence_penalty = 0.3f;
    p.frequency_penalty = 0.1f;
    p.top_logprobs = 5;
    Sampler s(p);
    std::vector<int32_t> prompt(100);
    std::iota(prompt.begin(), prompt.end(), 0);
    s.set_prompt(prompt, /*max_new_tokens=*/64);
    std::vector<float> row(base.size());
    StepLogprobs lp;
    const auto step = [&] {
      std::copy(base.begin(), base.end(), row.begin());
      s.accept(s.sample(row, &lp));
    };
    for (int i = 0; i < 4; ++i) step();  // scratch sized on the first steps
    testing::AllocCounter allocs;
    for (int i = 0; i < 40; ++i) step();
    EXPECT_EQ(allocs.count(), 0) << "T=" << p.temperature << " top_k=" << p.top_k
                                 << " top_p=" << p.top_p << " min_p=" << p.min_p;
  }
}

// ---------------------------------------------------------------- logprobs

std::vector<double> direct_log_softmax(const std::vector<float>& l) {
  double mx = -INFINITY;
  for (float x : l) mx = std::max(mx, double(x));
  double z = 0;
  for (float x : l) z += std::exp(double(x) - mx);
  std::vector<double> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = double(l[i]) - mx - std::log(z);
  return out;
}

void expect_logprobs(const std::vector<float>& l, int32_t chosen, int32_t n, double tol) {
  std::vector<float> scratch(l.size());
  StepLogprobs out;
  compute_logprobs(l, chosen, n, scratch, out);
  const auto ref = direct_log_softmax(l);
  EXPECT_EQ(out.chosen.token, chosen);
  EXPECT_NEAR(out.chosen.logprob, ref[size_t(chosen)], tol);
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  const int32_t want_n = std::min<int32_t>(std::min(n, kMaxTopLogprobs), int32_t(l.size()));
  ASSERT_EQ(out.n_top, want_n);
  for (int32_t j = 0; j < want_n; ++j) {
    EXPECT_EQ(out.top[size_t(j)].token, order[size_t(j)]) << "rank " << j;
    EXPECT_NEAR(out.top[size_t(j)].logprob, ref[size_t(order[size_t(j)])], tol) << "rank " << j;
  }
}

TEST(LogprobsTopN, MatchesDirectLogSoftmax) {
  const auto l = make_logits(1000, 13);  // 1/1000 steps over 10: many ties
  expect_logprobs(l, 17, 20, 2e-5);
  expect_logprobs(l, 999, 5, 2e-5);
  expect_logprobs(l, 0, 0, 2e-5);
  expect_logprobs(l, 3, 50, 2e-5);                                    // clamped to 20
  expect_logprobs(std::vector<float>{0.5f, -1.f, 2.f}, 1, 20, 1e-6);  // fewer tokens than asked
  const auto big = make_logits(262144, 14, -20.f, 20.f);
  expect_logprobs(big, 123456, 20, 1e-4);
  // A token far below the rest keeps a finite, exact logprob even though its
  // probability underflows FP32.
  std::vector<float> far(100, 0.f);
  far[42] = -200.f;
  expect_logprobs(far, 42, 3, 1e-4);
}

// Prompt positions: any number of alternatives (insertion up to 64, a
// partial sort above), stored per position.
TEST(LogprobsTopN, PromptPositionsAnyCount) {
  const auto l = make_logits(1000, 21);
  std::vector<float> scratch(l.size());
  std::vector<double> ref;
  log_softmax(l, ref);
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  for (int32_t n : {0, 1, 64, 65, 300, 1000, 5000}) {
    PromptLogprobs p;
    p.reset(/*first_pos=*/5, /*count=*/3, n);
    EXPECT_FALSE(p.complete());
    for (int64_t pos = 5; pos < 8; ++pos) p.record(pos, l, int32_t(pos * 7), scratch);
    EXPECT_TRUE(p.complete());
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(p.chosen[size_t(i)].token, int32_t((i + 5) * 7));
      EXPECT_NEAR(p.chosen[size_t(i)].logprob, ref[size_t((i + 5) * 7)], 2e-5);
      const auto top = p.top_at(i);
      ASSERT_EQ(int32_t(top.size()), std::min<int32_t>(n, 1000)) << n;
      for (size_t j = 0; j < top.size(); ++j) {
        ASSERT_EQ(top[j].token, order[j]) << "n " << n << " rank " << j;
        EXPECT_NEAR(top[j].logprob, ref[size_t(order[j])], 2e-5);
      }
    }
  }
}

// The sampler reports the penalised logits' log-softmax at temperature 1,
// whatever the temperature and truncation used to draw.
TEST(LogprobsSampler, PenalisedLogitsBeforeTemperature) {
  SamplingParams p = params(0.5f, 10, 0.8f, 0.f, 5);
  p.presence_penalty = 1.f;
  p.top_logprobs = 3;
  Sampler s(p);
  s.set_prompt({});
  s.accept(4);
  const auto base = make_logits(64, 15);
  std::vector<float> row = base;
  StepLogprobs lp;
  const int32_t t = s.sample(row, &lp);
  std::vector<float> penalised = base;
  penalised[4] -= 1.f;
  const auto ref = direct_log_softmax(penalised);
  EXPECT_EQ(lp.chosen.token, t);
  EXPECT_NEAR(lp.chosen.logprob, ref[size_t(t)], 1e-5);
  ASSERT_EQ(lp.n_top, 3);
  const auto top = lp.top_tokens();
  EXPECT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, Sampler::argmax(penalised));
  EXPECT_NEAR(top[0].logprob, ref[size_t(top[0].token)], 1e-5);
}

}  // namespace
}  // namespace kvant
