// WikiText-2 windows for perplexity and KL: the whole text tokenized once
// (in-process or through the server's /tokenize), window starts every
// stride tokens (a spread subset under --limit), BOS first for models that
// add it; and the windows' scored positions fetched from a server,
// --concurrency at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "eval/remote.h"
#include "eval/runner.h"

namespace kvant::eval {

struct WindowPlan {
  std::vector<int32_t> toks;  // the whole text
  std::vector<int64_t> starts;
  int64_t W = 0, S = 0, score = 0;
  int32_t bos = -1;
};

Result<WindowPlan> plan_windows(Ctx& c, int64_t W, int64_t S, int64_t score, size_t limit);
// The tokens of the window starting at `start`.
std::vector<int32_t> window_tokens(const WindowPlan& p, int64_t start);

// Windows through the server, --concurrency at once: the scored positions
// [W - score, W) of each, with `top_n` alternatives.
class WindowFetcher {
 public:
  WindowFetcher(const Ctx& c, int64_t from, int top_n) : c_(c), from_(from), top_n_(top_n) {}
  // Window w's positions; fetches w and the next ones (window_of(k) gives their tokens).
  Result<std::vector<ServerPosition>> get(size_t w, size_t n,
                                          const std::function<std::vector<int32_t>(size_t)>& window_of) {
    if (!have_.count(w)) {
      have_.clear();
      const size_t m = std::min(n - w, size_t(std::max(1, c_.o.concurrency)));
      std::vector<std::vector<ServerPosition>> got(m);
      std::vector<std::vector<int32_t>> wins;
      for (size_t k = 0; k < m; ++k) wins.push_back(window_of(w + k));
      KV_TRY(run_parallel(m, c_.o.concurrency, [&](size_t k) -> Result<void> {
        auto r = server_prompt_logprobs(c_, wins[k], from_, top_n_);
        if (!r) return r.error();
        got[k] = std::move(*r);
        return {};
      }));
      for (size_t k = 0; k < m; ++k) have_[w + k] = std::move(got[k]);
    }
    return std::move(have_[w]);
  }

 private:
  const Ctx& c_;
  int64_t from_;
  int top_n_;
  std::map<size_t, std::vector<ServerPosition>> have_;
};

}  // namespace kvant::eval
