// The normaliser comes from the vectorised softmax kernel rather than a scalar
// exp loop: a 262k-entry vocabulary costs a quarter of a millisecond per step
// in scalar expf, per request. With p = softmax(x), p[argmax] = 1 / sum
// exp(x - max), so log Z = max - log p[argmax] holds for every token,
// including those whose own probability underflows to 0 in FP32.
#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "kernels/cpu/kernels.h"

namespace kvant {

double log_sum_exp(std::span<const float> logits, std::span<float> scratch) {
  const size_t n = logits.size();
  KV_CHECK_GE(scratch.size(), n);
  if (n == 0) return -std::numeric_limits<double>::infinity();
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  const float mx = logits[best];
  if (std::isinf(mx)) return double(mx);  // all masked (-inf) or a certain token (+inf)
  std::copy(logits.begin(), logits.end(), scratch.begin());
  kernels::active().softmax(scratch.data(), int64_t(n));
  return double(mx) - std::log(double(scratch[best]));
}

void compute_logprobs(std::span<const float> logits, int32_t chosen, int32_t top_n,
                      std::span<float> scratch, StepLogprobs& out) {
  const double log_z = log_sum_exp(logits, scratch);
  const auto lp = [&](int32_t t) { return float(double(logits[size_t(t)]) - log_z); };
  out.chosen = {chosen, chosen >= 0 && size_t(chosen) < logits.size()
                            ? lp(chosen)
                            : -std::numeric_limits<float>::infinity()};

  // Insertion into a sorted array of at most 20: after the first few hundred
  // entries almost every logit fails the first comparison, so this is one
  // pass over the row.
  const int32_t n = std::clamp(top_n, 0, std::min(kMaxTopLogprobs, int32_t(logits.size())));
  int32_t have = 0;
  for (int32_t i = 0; n > 0 && i < int32_t(logits.size()); ++i) {
    const float x = logits[size_t(i)];
    if (have == n && !(x > logits[size_t(out.top[size_t(n - 1)].token)])) continue;
    if (std::isnan(x)) continue;
    // Strictly greater moves up, so an equal logit stays behind the lower id.
    int32_t pos = have < n ? have++ : n - 1;
    while (pos > 0 && x > logits[size_t(out.top[size_t(pos - 1)].token)]) {
      out.top[size_t(pos)] = out.top[size_t(pos - 1)];
      --pos;
    }
    out.top[size_t(pos)].token = i;
  }
  out.n_top = have;
  for (int32_t j = 0; j < have; ++j) out.top[size_t(j)].logprob = lp(out.top[size_t(j)].token);
}

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, double(x));
  double s = 0;
  for (float x : logits) s += std::exp(double(x) - mx);
  const double lse = mx + std::log(s);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
}

}  // namespace kvant
