// Scoring over a server, for `kvant eval --url`. Log-likelihoods come from
// /v1/completions with echo, max_tokens 0 and logprobs (the legacy API's way
// of scoring a prompt), the prompt sent as token ids that /tokenize made, so
// the tokens are exactly the in-process run's. Two extensions keep it exact
// and cheap: return_tokens_as_token_ids (vLLM's; ids instead of text, which
// can collide) and prompt_logprobs_from (kvant's; a server without it
// returns every position, which works too).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/logprobs.h"
#include "eval/runner.h"

namespace kvant::eval {

// Runs fn(0..n-1) on `threads` threads; the first error wins.
Result<void> run_parallel(size_t n, int threads, const std::function<Result<void>(size_t)>& fn);

// The server's tokens of `text` (its /tokenize).
Result<std::vector<int32_t>> server_tokenize(const Ctx& c, const std::string& text,
                                             bool add_special);
// "token_id:N" (return_tokens_as_token_ids) -> N.
Result<int32_t> token_id_of(const std::string& s);

// One scored prompt position: the log-probability of the prompt's token
// there and the server's top alternatives (most likely first).
struct ServerPosition {
  double logprob = 0;
  std::vector<TokenLogprob> top;
};

// The positions [from, ids.size()) of the prompt `ids`.
Result<std::vector<ServerPosition>> server_prompt_logprobs(const Ctx& c,
                                                           const std::vector<int32_t>& ids,
                                                           int64_t from, int top_n);
// The harness's tokenization (scorer.h), through /tokenize.
Result<TokenizedRequests> server_tokenize_requests(const Ctx& c,
                                                   const std::vector<LoglikRequest>& reqs);
// Each continuation's log-likelihood after the context, one request each.
Result<std::vector<ChoiceScore>> server_score(const Ctx& c, const TokenizedRequests& t);

}  // namespace kvant::eval
