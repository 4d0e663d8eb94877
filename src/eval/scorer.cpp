#include "eval/scorer.h"

#include <algorithm>

#include "engine/logprobs.h"
#include "engine/sampler.h"

namespace kvant::eval {

TokenizedRequests tokenize_requests(const Tokenizer& tok, const std::vector<LoglikRequest>& reqs) {
  TokenizedRequests t;
  t.ctx = tok.encode(reqs[0].context, true, false);
  for (const auto& r : reqs) {
    const auto whole = tok.encode(r.context + r.continuation, true, false);
    const auto ctx = r.context == reqs[0].context ? t.ctx : tok.encode(r.context, true, false);
    std::vector<int32_t> cont;
    if (whole.size() > ctx.size()) cont.assign(whole.begin() + long(ctx.size()), whole.end());
    t.conts.push_back(std::move(cont));
  }
  return t;
}

LoglikScorer::LoglikScorer(ModelRunner& m, const SeqKvOptions& kv, int64_t capacity, int64_t chunk)
    : model_(m),
      kv_(std::make_unique<SeqKv>(m.config(), capacity, kv)),
      capacity_(capacity),
      chunk_(std::max<int64_t>(1, chunk)) {}

Result<void> LoglikScorer::run(std::span<const int32_t> ids, int64_t pos0, bool all_logits) {
  if (pos0 + int64_t(ids.size()) > capacity_)
    return make_error("eval: " + std::to_string(pos0 + int64_t(ids.size())) +
                      " tokens exceed the scoring context of " + std::to_string(capacity_) +
                      " (--max-len)");
  const RunChunk chunk{kv_.get(), pos0, ids, all_logits};
  logits_.resize(size_t(chunk.logit_count() * model_.config().vocab));
  return model_.forward(chunk, logits_);
}

Result<void> LoglikScorer::prime(std::span<const int32_t> ids) {
  size_t keep = 0;
  while (keep < cached_.size() && keep < ids.size() && cached_[keep] == ids[keep]) ++keep;
  keep = keep / size_t(chunk_) * size_t(chunk_);
  cached_.resize(keep);
  int64_t p = int64_t(keep);
  const int64_t n = int64_t(ids.size());
  while (p < n) {
    const int64_t end = std::min(n, (p / chunk_ + 1) * chunk_);
    KV_TRY(run(ids.subspan(size_t(p), size_t(end - p)), p, false));
    cached_.insert(cached_.end(), ids.begin() + p, ids.begin() + end);
    p = end;
  }
  return {};
}

Result<std::vector<ChoiceScore>> LoglikScorer::score(
    std::span<const int32_t> context, const std::vector<std::vector<int32_t>>& conts) {
  if (link_ != nullptr) KV_TRY(link_->send_score(context, conts));
  if (context.empty()) return make_error("eval: empty context");
  KV_TRY(prime(context.first(context.size() - 1)));
  const int64_t V = model_.config().vocab;
  const int64_t pos0 = int64_t(context.size()) - 1;
  std::vector<ChoiceScore> out;
  std::vector<double> lp;
  std::vector<int32_t> ids;
  for (const auto& c : conts) {
    if (c.empty()) return make_error("eval: empty continuation");
    ids.assign(1, context.back());
    ids.insert(ids.end(), c.begin(), c.end() - 1);
    KV_TRY(run(ids, pos0, true));
    ChoiceScore s;
    s.greedy = true;
    s.tokens = int64_t(c.size());
    for (size_t i = 0; i < c.size(); ++i) {
      std::span<const float> row(logits_.data() + int64_t(i) * V, size_t(V));
      log_softmax(row, lp);
      s.logprob += lp[size_t(c[i])];
      s.greedy = s.greedy && Sampler::argmax(row) == c[i];
    }
    out.push_back(s);
  }
  return out;
}

Result<void> LoglikScorer::window(std::span<const int32_t> tokens, int64_t first,
                                  const std::function<void(int64_t, std::span<const float>)>& row) {
  if (link_ != nullptr) KV_TRY(link_->send_window(tokens, first));
  cached_.clear();
  const int64_t n = int64_t(tokens.size()) - 1;  // the last token is only predicted
  const int64_t V = model_.config().vocab;
  for (int64_t p = 0; p < n;) {
    const int64_t end = std::min(n, (p / chunk_ + 1) * chunk_);
    const bool want = end > first;
    KV_TRY(run(tokens.subspan(size_t(p), size_t(end - p)), p, want));
    if (want)
      for (int64_t q = std::max(p, first); q < end; ++q)
        row(q, std::span<const float>(logits_.data() + (q - p) * V, size_t(V)));
    p = end;
  }
  return {};
}

}  // namespace kvant::eval
