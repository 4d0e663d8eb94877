// Penalties follow the common definitions: repetition divides positive and
// multiplies negative logits of seen tokens; presence subtracts once per seen
// token, frequency once per occurrence. Ties in greedy go to the lowest id.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace kvant {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

int32_t Sampler::argmax(std::span<const float> l) {
  int32_t best = 0;
  for (size_t i = 1; i < l.size(); ++i)
    if (l[i] > l[size_t(best)]) best = int32_t(i);
  return best;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const int32_t V = int32_t(logits.size());
  const bool penalise = p_.repetition_penalty != 1.f || p_.presence_penalty != 0.f ||
                        p_.frequency_penalty != 0.f;
  if (penalise && !history.empty()) {
    if (int32_t(counts_.size()) != V) counts_.assign(size_t(V), 0);
    for (int32_t t : history)
      if (t >= 0 && t < V) counts_[size_t(t)]++;
    for (int32_t t : history) {
      if (t < 0 || t >= V || counts_[size_t(t)] == 0) continue;
      float& x = logits[size_t(t)];
      if (p_.repetition_penalty != 1.f) x = x > 0 ? x / p_.repetition_penalty : x * p_.repetition_penalty;
      x -= p_.presence_penalty + p_.frequency_penalty * float(counts_[size_t(t)]);
      counts_[size_t(t)] = 0;  // apply once per distinct token; also resets for next call
    }
  }
  if (p_.temperature <= 0.f) return argmax(logits);

  cand_.clear();
  for (int32_t i = 0; i < V; ++i) cand_.emplace_back(logits[size_t(i)] / p_.temperature, i);
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t n = cand_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = size_t(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  const float mx = cand_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    cand_[i].first = std::exp(cand_[i].first - mx);
    sum += cand_[i].first;
  }
  // min-p: drop tokens below min_p times the top probability.
  if (p_.min_p > 0.f) {
    size_t keep = 1;
    while (keep < n && cand_[keep].first >= p_.min_p * cand_[0].first) ++keep;
    for (size_t i = keep; i < n; ++i) sum -= cand_[i].first;
    n = keep;
  }
  if (p_.top_p < 1.f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < n) {
      acc += cand_[keep].first / sum;
      ++keep;
      if (acc >= p_.top_p) break;
    }
    double s2 = 0;
    for (size_t i = 0; i < keep; ++i) s2 += cand_[i].first;
    sum = s2;
    n = keep;
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_), acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += cand_[i].first;
    if (r < acc) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace kvant
