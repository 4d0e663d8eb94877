// Token sampling for one request: penalties, greedy, temperature, top-k,
// top-p, min-p, a per-request seeded generator, and the step's logprobs.
// A Sampler lives as long as its request (through preemption and recompute)
// and keeps the request's token counts and its scratch, so a decode step
// neither rescans the history nor allocates once warm. It does not own stop
// conditions (stop_matcher.h) or the logits (the caller's row, [vocab]).
//
// Order of operations on one row of logits, the same as Hugging Face's
// generate() warpers:
//   1. penalties, in place: repetition (over prompt + generated tokens: seen
//      positive logits divided by it, negative ones multiplied), then
//      presence and frequency (over generated tokens only, OpenAI's rule:
//      logit -= presence * [count > 0] + frequency * count);
//   2. logprobs, when asked for: log-softmax of these penalised logits at
//      temperature 1. OpenAI reports the model's distribution, which
//      temperature and truncation are not part of (they would make the
//      logprobs depend on sampling knobs and give -inf to truncated tokens);
//      penalties are, since they change what the request asked the model;
//   3. temperature 0 (below 1e-5, or top_k 1): the largest logit, ties to
//      the lowest id;
//   4. otherwise softmax(logits / temperature), then top-k (the k largest,
//      ties to the lower id), then top-p (the shortest most-likely-first
//      prefix of the top-k distribution, renormalised, whose mass reaches
//      top_p), then min-p (tokens whose probability is at least min_p times
//      the top token's), renormalise and draw.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/result.h"
#include "engine/logprobs.h"

namespace kvant {

struct SamplingParams {
  float temperature = 0.f;         // 0 = greedy
  int32_t top_k = 0;               // 0 (or -1, or >= vocab) = off
  float top_p = 1.f;               // in (0, 1]; 1 = off
  float min_p = 0.f;               // in [0, 1]; 0 = off
  float repetition_penalty = 1.f;  // > 0; 1 = off
  float presence_penalty = 0.f;    // in [-2, 2]
  float frequency_penalty = 0.f;   // in [-2, 2]
  // Requests that name no seed should get one from the engine, so that a
  // request's stream never depends on which other requests run beside it.
  uint64_t seed = 0;
  int32_t top_logprobs = 0;  // alternatives reported per step, [0, kMaxTopLogprobs]
  // Added to a token's logit before anything else looks at it (greedy
  // included), after the penalties: (token, bias in [-100, 100]), each token
  // at most once, at most kMaxLogitBias entries.
  std::vector<std::pair<int32_t, float>> logit_bias;
};
inline constexpr size_t kMaxLogitBias = 1024;

// An error naming the first field out of range, for a client's bad request.
Result<void> check_sampling_params(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);

  const SamplingParams& params() const { return p_; }

  // Starts (or restarts) a request: forgets every counted token, then counts
  // the prompt for the repetition penalty. Room for `max_new_tokens` distinct
  // generated tokens is reserved here so that accept() does not allocate.
  void set_prompt(std::span<const int32_t> prompt, int32_t max_new_tokens = 0);
  // Counts a generated token for the penalties (normally what sample() chose;
  // a token from elsewhere, such as a recomputed one, counts the same).
  void accept(int32_t token);

  // Chooses the next token from `logits` [vocab]. Penalties are applied to
  // `logits` in place, which is what the logprobs see. The token is not
  // counted: call accept() with it. With `logprobs` non-null it receives the
  // chosen token's logprob and params().top_logprobs alternatives.
  int32_t sample(std::span<float> logits, StepLogprobs* logprobs = nullptr);

  // A convenience for one-shot loops that keep the whole sequence: the first
  // call takes `history` as the prompt (set_prompt), later calls count the
  // tokens appended since the previous call as generated. A history that is
  // shorter than last time, or whose last counted token changed, restarts.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);

  // The largest logit, ties to the lowest id; 0 for an empty row.
  static int32_t argmax(std::span<const float> logits);
  // The random stream's position, to continue a request's sampling in
  // another engine (disaggregated decode) exactly where it stopped.
  uint64_t rng_state() const { return rng_state_; }
  void set_rng_state(uint64_t s) { rng_state_ = s; }

 private:
  // A distinct token seen so far: in the prompt, and how often generated.
  struct Seen {
    int32_t token;
    int32_t generated;
    bool in_prompt;
  };
  // A candidate during truncation: a logit or a probability, and its id.
  struct Cand {
    float value;
    int32_t token;
  };

  bool penalised() const;
  Seen& find_or_insert(int32_t token);
  void rehash(size_t min_entries);
  void apply_penalties(std::span<float> logits) const;
  double uniform();  // [0, 1), 53 bits
  int32_t sample_top_k(std::span<const float> logits);
  int32_t sample_softmax(std::span<const float> logits);
  // Keeps the top-p and min-p prefix of cand_[0, n) (sorted, weights in
  // .value, the first the largest) and draws from it.
  int32_t truncate_and_draw(size_t n, double total);
  // Gathers into cand_ the tokens of `probs` at or above `floor` that form
  // the shortest most-likely-first run whose mass reaches `target`, and
  // returns how many there are (in no particular order).
  size_t nucleus(std::span<const float> probs, float floor, double target);
  // Draws from the weights cand_[0, n), in whatever order they are.
  int32_t draw(size_t n);

  static constexpr float kGreedyBelow = 1e-5f;  // temperatures that mean greedy
  static constexpr size_t kBlock = 256;         // probs_ entries per blocks_ sum
  // Top-p histogram bins: the sign, exponent and 3 mantissa bits of a float.
  static constexpr uint32_t kBinShift = 20;
  static constexpr uint32_t kBins = 1u << (32 - kBinShift);

  SamplingParams p_;
  uint64_t rng_state_;

  // Penalty counts: seen_ in first-seen order (the per-step loop walks it),
  // slots_ an open-addressing index into it keyed by token id (-1 = empty),
  // a power-of-two size at most half full. Memory follows the distinct
  // tokens of the request, not the vocabulary size.
  std::vector<Seen> seen_;
  std::vector<int32_t> slots_;

  std::vector<Cand> cand_;      // truncation candidates
  std::vector<float> probs_;    // [vocab] softmax / logprob scratch
  std::vector<double> blocks_;  // [vocab / kBlock] sums of probs_
  std::vector<double> hist_;    // [kBins] top-p mass by value bin
  int64_t history_len_ = -1;    // tokens counted through sample(logits, history)
  int32_t history_last_ = -1;
};

}  // namespace kvant
