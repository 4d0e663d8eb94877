// Token sampling from one row of logits: greedy, temperature, top-k, top-p,
// min-p, repetition/presence/frequency penalties, seeded. Owns its RNG; keeps
// scratch between calls so steady-state sampling does not allocate.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kvant {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int32_t top_k = 0;        // 0 = off
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // `history` is what counts for penalties (prompt and generated tokens).
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);
  static int32_t argmax(std::span<const float> logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<int32_t> counts_;
};

}  // namespace kvant
