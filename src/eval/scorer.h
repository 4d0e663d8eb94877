// Log-likelihood scoring on an in-process model, for `kvant eval`: the
// multiple-choice tasks' per-choice log-probabilities and the rolling
// windows of perplexity and KL divergence. One sequence cache (SeqKv, BF16
// or FP8 as asked) is reused: tokens it already holds are not recomputed.
//
// Procedure, fixed so that a result depends only on the item, never on what
// ran before it: the cache keeps the longest common token prefix with the
// previous request, cut down to a multiple of `chunk` positions; the rest of
// the context but its last token is run in chunks that end on multiples of
// `chunk`; then each continuation runs as one chunk of its own (the
// context's last token followed by the continuation but its last token),
// whose logits score it. Multi-token chunks use the prefill weights, single
// tokens the decode weights (engine/model_runner.h), and each chunk reads
// earlier positions back from the cache's pages, as serving does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "engine/model_runner.h"
#include "eval/eval_link.h"
#include "eval/tasks.h"
#include "model/seq_kv.h"
#include "tokenizer/tokenizer.h"

namespace kvant::eval {

// Tokenization as the harness does it: whole = enc(context + continuation)
// (BOS first for models that add it), the context enc(context), each
// continuation whole[len(enc(context)):].
struct TokenizedRequests {
  std::vector<int32_t> ctx;
  std::vector<std::vector<int32_t>> conts;
};
TokenizedRequests tokenize_requests(const Tokenizer& tok, const std::vector<LoglikRequest>& reqs);

struct ChoiceScore {
  double logprob = 0;   // sum over the continuation's tokens
  bool greedy = false;  // every continuation token was the argmax
  int64_t tokens = 0;
};

class LoglikScorer {
 public:
  LoglikScorer(ModelRunner& m, const SeqKvOptions& kv, int64_t capacity, int64_t chunk = 128);
  const ModelConfig& config() const { return model_.config(); }
  // Over several ranks, rank 0's scorer tells the others each call before
  // it runs it (eval/eval_link.h); they make the same call on theirs.
  void set_link(EvalLink* link) { link_ = link; }
  int64_t capacity() const { return capacity_; }

  // Scores each continuation (token ids, non-empty) after `context` (non-empty).
  Result<std::vector<ChoiceScore>> score(std::span<const int32_t> context,
                                         const std::vector<std::vector<int32_t>>& continuations);

  // Runs `tokens` from position 0 and calls `row(p, logits)` for every
  // position p in [first, tokens.size() - 1): the logits that predict
  // tokens[p + 1].
  Result<void> window(std::span<const int32_t> tokens, int64_t first,
                      const std::function<void(int64_t, std::span<const float>)>& row);

 private:
  Result<void> run(std::span<const int32_t> ids, int64_t pos0, bool all_logits);
  Result<void> prime(std::span<const int32_t> ids);  // cache = ids, nothing scored

  ModelRunner& model_;
  EvalLink* link_ = nullptr;
  std::unique_ptr<SeqKv> kv_;
  int64_t capacity_, chunk_;
  std::vector<int32_t> cached_;
  std::vector<float> logits_;
};

}  // namespace kvant::eval
