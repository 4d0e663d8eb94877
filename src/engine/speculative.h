// Speculative decoding by prompt lookup: draft tokens come from the request's
// own text (prompt and output so far) rather than from a second model. When
// the last few tokens appeared before, the tokens that followed them then are
// offered as the continuation; the engine feeds them after the last token in
// one forward, each as a decode of its own position (same weights, same
// paged attention, so the logits are bitwise those of decoding one token at
// a time), draws from each row in order with the request's own sampler, and
// keeps draft tokens while the drawn token equals the draft. The output is
// therefore exactly what decoding without a draft gives, for greedy and
// seeded sampling alike; a draft only changes how many tokens a step yields.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"

namespace kvant {

// Where drafts come from: prompt lookup, or the model's multi-token-
// prediction layer (an engine started with EngineOptions::mtp), which
// predicts the token after next from the main model's last hidden state and
// the token just drawn (the layer's argmax); further draft tokens run the
// layer again on its own output and its last draft token.
enum class SpecMethod : int32_t { kNgram = 0, kMtp = 1 };

struct SpeculativeParams {
  // Draft tokens offered per step at most; 0: off.
  int32_t num_tokens = 0;
  // Lengths of the suffix looked up, longest first: a match of max_ngram
  // tokens is tried before shorter ones, down to min_ngram.
  int32_t min_ngram = 2;
  int32_t max_ngram = 4;
  SpecMethod method = SpecMethod::kNgram;
};

// Errors: num_tokens outside [0, 16], min_ngram < 1,
// max_ngram < min_ngram or > 16, an unknown method.
Result<void> check_speculative_params(const SpeculativeParams& p);

// The draft for `tokens` (prompt + output so far): for n from max_ngram down
// to min_ngram, the latest earlier occurrence of the last n tokens, and the
// up to num_tokens tokens that followed it. Empty when nothing matches.
// Written into `draft` (cleared first).
void ngram_propose(std::span<const int32_t> tokens, const SpeculativeParams& p,
                   std::vector<int32_t>& draft);

}  // namespace kvant
