// The normaliser comes from the vectorised softmax kernel rather than a scalar
// exp loop: a 262k-entry vocabulary costs a quarter of a millisecond per step
// in scalar expf, per request. With p = softmax(x), p[argmax] = 1 / sum
// exp(x - max), so log Z = max - log p[argmax] holds for every token,
// including those whose own probability underflows to 0 in FP32.
#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "backend/host.h"

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
  backend::host_softmax(scratch.data(), int64_t(n));
  return double(mx) - std::log(double(scratch[best]));
}

int32_t top_logprobs(std::span<const float> logits, double log_z, int32_t top_n,
                     TokenLogprob* out) {
  const int32_t n = std::clamp(top_n, 0, int32_t(logits.size()));
  int32_t have = 0;
  if (n > 64) {
    // Many alternatives: a partial sort of the ids.
    std::vector<int32_t> ids;
    ids.reserve(logits.size());
    for (int32_t i = 0; i < int32_t(logits.size()); ++i)
      if (!std::isnan(logits[size_t(i)])) ids.push_back(i);
    have = std::min(n, int32_t(ids.size()));
    std::partial_sort(ids.begin(), ids.begin() + have, ids.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] != logits[size_t(b)] ? logits[size_t(a)] > logits[size_t(b)] : a < b;
    });
    for (int32_t j = 0; j < have; ++j) out[j].token = ids[size_t(j)];
  } else {
    // Insertion into a sorted array of at most 64: after the first few
    // hundred entries almost every logit fails the first comparison, so this
    // is one pass over the row.
    for (int32_t i = 0; n > 0 && i < int32_t(logits.size()); ++i) {
      const float x = logits[size_t(i)];
      if (have == n && !(x > logits[size_t(out[n - 1].token)])) continue;
      if (std::isnan(x)) continue;
      // Strictly greater moves up, so an equal logit stays behind the lower id.
      int32_t pos = have < n ? have++ : n - 1;
      while (pos > 0 && x > logits[size_t(out[pos - 1].token)]) {
        out[pos] = out[pos - 1];
        --pos;
      }
      out[pos].token = i;
    }
  }
  for (int32_t j = 0; j < have; ++j)
    out[j].logprob = float(double(logits[size_t(out[j].token)]) - log_z);
  return have;
}

void compute_logprobs(std::span<const float> logits, int32_t chosen, int32_t top_n,
                      std::span<float> scratch, StepLogprobs& out) {
  const double log_z = log_sum_exp(logits, scratch);
  out.chosen = {chosen, chosen >= 0 && size_t(chosen) < logits.size()
                            ? float(double(logits[size_t(chosen)]) - log_z)
                            : -std::numeric_limits<float>::infinity()};
  out.n_top = top_logprobs(logits, log_z, std::min(top_n, kMaxTopLogprobs), out.top.data());
}

void PromptLogprobs::reset(int64_t first_pos, int64_t count, int32_t top) {
  first = first_pos;
  top_n = top;
  chosen.assign(size_t(count), TokenLogprob{});
  n_top.assign(size_t(count), 0);
  alternatives.assign(size_t(count) * size_t(top), TokenLogprob{});
  filled.assign(size_t(count), 0);
}

void PromptLogprobs::record(int64_t pos, std::span<const float> logits, int32_t actual,
                            std::span<float> scratch) {
  const int64_t i = pos - first;
  KV_CHECK(i >= 0 && i < size());
  const double log_z = log_sum_exp(logits, scratch);
  chosen[size_t(i)] = {actual, actual >= 0 && size_t(actual) < logits.size()
                                   ? float(double(logits[size_t(actual)]) - log_z)
                                   : -std::numeric_limits<float>::infinity()};
  n_top[size_t(i)] = top_n > 0 ? top_logprobs(logits, log_z, top_n,
                                              alternatives.data() + size_t(i) * size_t(top_n))
                               : 0;
  filled[size_t(i)] = 1;
}

bool PromptLogprobs::complete() const {
  return std::all_of(filled.begin(), filled.end(), [](uint8_t f) { return f != 0; });
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
