// WikiText-2 windows (windows.h).
#include "eval/windows.h"

namespace kvant::eval {

Result<WindowPlan> plan_windows(Ctx& c, int64_t W, int64_t S, int64_t score, size_t limit) {
  auto text = load_wikitext2_test(c.data);
  if (!text) return text.error();
  WindowPlan p;
  if (!c.o.url.empty()) {
    auto t = server_tokenize(c, *text, false);
    if (!t) return t.error();
    p.toks = std::move(*t);
    auto b = server_tokenize(c, "", true);  // [BOS] for a model that adds it
    if (!b) return b.error();
    p.bos = b->empty() ? -1 : (*b)[0];
  } else {
    KV_TRY(ensure_tokenizer(c));
    p.toks = c.tok->encode(*text, false, false);
    p.bos = c.tok->adds_bos() ? c.tok->bos_id() : -1;
  }
  p.W = W;
  p.S = S;
  p.score = score;
  if (int64_t(p.toks.size()) < W) return make_error("eval: WikiText-2 is shorter than one window");
  const size_t n = size_t((int64_t(p.toks.size()) - W) / S + 1);
  for (size_t i : spread_subset(n, limit)) p.starts.push_back(int64_t(i) * S);
  return p;
}

std::vector<int32_t> window_tokens(const WindowPlan& p, int64_t start) {
  std::vector<int32_t> w(p.toks.begin() + start, p.toks.begin() + start + p.W);
  if (p.bos >= 0) w[0] = p.bos;  // as llama-perplexity: BOS first for models that add it
  return w;
}

}  // namespace kvant::eval
