// Per-step log-probabilities for the OpenAI `logprobs` / `top_logprobs`
// options: the chosen token's logprob and the N most likely tokens'. Owns the
// log-softmax over one row of logits and the top-N selection; it does not
// decide which logits it is given (the sampler passes them after penalties
// and before temperature, see sampler.h) nor how they are serialised.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace kvant {

// OpenAI accepts top_logprobs in [0, 20].
inline constexpr int32_t kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.f;
};

// Fixed capacity so that a step's logprobs never touch the heap.
struct StepLogprobs {
  TokenLogprob chosen;
  int32_t n_top = 0;
  std::array<TokenLogprob, kMaxTopLogprobs> top{};  // [n_top], most likely first, ties: lower id

  std::span<const TokenLogprob> top_tokens() const { return {top.data(), size_t(n_top)}; }
};

// log(sum_i exp(logits[i])), through the kernel table's softmax on `scratch`
// (at least logits.size() floats). -inf when every logit is -inf.
double log_sum_exp(std::span<const float> logits, std::span<float> scratch);

// The whole log-softmax of one row, in double precision (evaluation tools:
// perplexity, KL divergence). `out` is resized to logits.size().
void log_softmax(std::span<const float> logits, std::vector<double>& out);

// The min(top_n, logits.size()) largest logits' tokens and log-probabilities
// (logit - log_z) into out[0..), most likely first, ties to the lower id;
// returns how many were written (NaN logits are never listed).
int32_t top_logprobs(std::span<const float> logits, double log_z, int32_t top_n,
                     TokenLogprob* out);

// Log-probabilities of a prompt's own tokens (the completions API's `echo`
// with `logprobs`, and evaluation over a server): for each prompt position p
// in [first, first + size()), the log-probability of prompt[p] given the
// tokens before it, and the top_n most likely tokens there.
struct PromptLogprobs {
  int64_t first = 1;
  int32_t top_n = 0;
  std::vector<TokenLogprob> chosen;        // [size()]
  std::vector<int32_t> n_top;              // [size()]
  std::vector<TokenLogprob> alternatives;  // [size() * top_n], each position's most likely first
  std::vector<uint8_t> filled;             // [size()]

  int64_t size() const { return int64_t(chosen.size()); }
  std::span<const TokenLogprob> top_at(int64_t i) const {
    return {alternatives.data() + size_t(i) * size_t(top_n), size_t(n_top[size_t(i)])};
  }
  void reset(int64_t first_pos, int64_t count, int32_t top);
  // Position pos's entry from the logits that predict it (the row of pos - 1).
  void record(int64_t pos, std::span<const float> logits, int32_t actual,
              std::span<float> scratch);
  bool complete() const;
};

// Fills `out` with the log-softmax of `logits` at `chosen` and at the
// min(top_n, kMaxTopLogprobs) largest logits. `scratch` as for log_sum_exp.
void compute_logprobs(std::span<const float> logits, int32_t chosen, int32_t top_n,
                      std::span<float> scratch, StepLogprobs& out);

}  // namespace kvant
