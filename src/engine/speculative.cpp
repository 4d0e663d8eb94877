// Prompt-lookup drafts (see speculative.h).
#include "engine/speculative.h"

#include <algorithm>

namespace kvant {

Result<void> check_speculative_params(const SpeculativeParams& p) {
  if (p.num_tokens < 0 || p.num_tokens > 16)
    return make_error("speculative num_tokens must be in [0, 16], got " +
                      std::to_string(p.num_tokens));
  if (p.method != SpecMethod::kNgram && p.method != SpecMethod::kMtp)
    return make_error("speculative method must be ngram or mtp, got " +
                      std::to_string(int32_t(p.method)));
  if (p.min_ngram < 1 || p.min_ngram > 16)
    return make_error("speculative min_ngram must be in [1, 16], got " +
                      std::to_string(p.min_ngram));
  if (p.max_ngram < p.min_ngram || p.max_ngram > 16)
    return make_error("speculative max_ngram must be in [min_ngram, 16], got " +
                      std::to_string(p.max_ngram) + " (min_ngram " + std::to_string(p.min_ngram) +
                      ")");
  return {};
}

void ngram_propose(std::span<const int32_t> tokens, const SpeculativeParams& p,
                   std::vector<int32_t>& draft) {
  draft.clear();
  const int64_t L = int64_t(tokens.size());
  if (p.num_tokens <= 0) return;
  for (int64_t n = std::min<int64_t>(p.max_ngram, L - 1); n >= p.min_ngram; --n) {
    const int32_t* suffix = tokens.data() + (L - n);
    // Latest start i < L - n whose n tokens equal the suffix; the tokens after
    // it (from i + n, before L) are the draft.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      if (tokens[size_t(i)] != suffix[0] || !std::equal(suffix, suffix + n, tokens.data() + i))
        continue;
      const int64_t from = i + n, to = std::min<int64_t>(L, from + p.num_tokens);
      draft.assign(tokens.begin() + from, tokens.begin() + to);
      return;
    }
  }
}

}  // namespace kvant
