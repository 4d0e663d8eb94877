// Stop strings are found with an Aho-Corasick automaton: one step per byte
// whatever the number of stop strings, and the node the scan ends on says
// directly how many trailing bytes could still begin a stop string, so the
// hold-back needs no rescanning of earlier text.
#include "engine/stop_matcher.h"

#include <algorithm>
#include <deque>

namespace kvant {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None:
      return "";
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::Error:
      return "error";
  }
  return "";
}

// ---------------------------------------------------------------- strings

StopStringMatcher::StopStringMatcher(std::span<const std::string> stops) {
  nodes_.emplace_back();
  lengths_.resize(stops.size(), 0);
  std::vector<int32_t> terminal(1, -1);  // [node] the stop string spelled exactly, -1 = none
  for (size_t s = 0; s < stops.size(); ++s) {
    const std::string& str = stops[s];
    lengths_[s] = int32_t(str.size());
    if (str.empty()) continue;
    int32_t node = 0;
    for (char ch : str) {
      const uint8_t b = uint8_t(ch);
      int32_t c = child(node, b);
      if (c < 0) {
        c = int32_t(nodes_.size());
        nodes_[size_t(node)].next.emplace_back(b, c);
        nodes_.emplace_back();
        nodes_.back().depth = nodes_[size_t(node)].depth + 1;
        terminal.push_back(-1);
      }
      node = c;
    }
    if (terminal[size_t(node)] < 0) terminal[size_t(node)] = int32_t(s);
  }
  // Breadth first, so a node's failure target (shallower) is final before
  // the node's own children need it.
  std::deque<int32_t> queue;
  for (const auto& [b, c] : nodes_[0].next) {
    nodes_[size_t(c)].fail = 0;
    queue.push_back(c);
  }
  for (auto& n : nodes_) n.out = -1;
  while (!queue.empty()) {
    const int32_t u = queue.front();
    queue.pop_front();
    Node& nu = nodes_[size_t(u)];
    nu.out = terminal[size_t(u)] >= 0 ? terminal[size_t(u)] : nodes_[size_t(nu.fail)].out;
    for (const auto& [b, v] : nodes_[size_t(u)].next) {
      if (u != 0) nodes_[size_t(v)].fail = advance(nodes_[size_t(u)].fail, b);
      queue.push_back(v);
    }
  }
}

int32_t StopStringMatcher::child(int32_t node, uint8_t b) const {
  for (const auto& [nb, c] : nodes_[size_t(node)].next)
    if (nb == b) return c;
  return -1;
}

int32_t StopStringMatcher::advance(int32_t node, uint8_t b) const {
  for (;;) {
    const int32_t c = child(node, b);
    if (c >= 0) return c;
    if (node == 0) return 0;
    node = nodes_[size_t(node)].fail;
  }
}

StopStringMatcher::Step StopStringMatcher::push(std::string_view piece, bool last) {
  out_.clear();
  if (done_) return {out_, -1};
  for (size_t i = 0; i < piece.size(); ++i) {
    state_ = advance(state_, uint8_t(piece[i]));
    const int32_t m = nodes_[size_t(state_)].out;
    if (m >= 0) {
      // The match ends at piece[i] and may begin inside the held text.
      out_.assign(held_);
      out_.append(piece.substr(0, i + 1));
      out_.resize(out_.size() - size_t(lengths_[size_t(m)]));
      held_.clear();
      done_ = true;
      return {out_, m};
    }
  }
  // The held text is always the last `depth` bytes seen: the longest tail
  // that is still the beginning of some stop string.
  const size_t hold = last ? 0 : size_t(nodes_[size_t(state_)].depth);
  out_.assign(held_);
  out_.append(piece);
  held_.assign(out_, out_.size() - hold, hold);
  out_.resize(out_.size() - hold);
  if (last) done_ = true;
  return {out_, -1};
}

// ---------------------------------------------------------------- tokens

Result<void> check_stop_params(const StopParams& p) {
  if (p.stop.size() > kMaxStopStrings)
    return make_error("stop: at most " + std::to_string(kMaxStopStrings) + " strings, got " +
                      std::to_string(p.stop.size()));
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) return make_error("stop[" + std::to_string(i) + "] is empty");
    if (p.stop[i].size() > kMaxStopStringBytes)
      return make_error("stop[" + std::to_string(i) + "] is " + std::to_string(p.stop[i].size()) +
                        " bytes; the limit is " + std::to_string(kMaxStopStringBytes));
  }
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i)
    if (p.stop_token_ids[i] < 0)
      return make_error("stop_token_ids[" + std::to_string(i) + "] is negative (" +
                        std::to_string(p.stop_token_ids[i]) + ")");
  if (p.max_tokens < 0)
    return make_error("max_tokens must be >= 0, got " + std::to_string(p.max_tokens));
  return {};
}

StopMatcher::StopMatcher(const StopParams& p, const Tokenizer& tokenizer)
    : stop_ids_(p.stop_token_ids),
      max_tokens_(p.max_tokens),
      decoder_(tokenizer, p.skip_special_tokens),
      strings_(p.stop) {
  if (!p.ignore_eos)
    stop_ids_.insert(stop_ids_.end(), tokenizer.eog_ids().begin(), tokenizer.eog_ids().end());
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
}

bool StopMatcher::is_stop_token(int32_t token) const {
  return std::binary_search(stop_ids_.begin(), stop_ids_.end(), token);
}

StopMatcher::Step StopMatcher::end(std::string_view tail, FinishReason reason) {
  const auto r = strings_.push(tail, /*last=*/true);
  finish_ = r.matched >= 0 ? FinishReason::Stop : reason;
  return {r.text, finish_, -1, r.matched};
}

StopMatcher::Step StopMatcher::step(int32_t token) {
  if (finish_ != FinishReason::None) return {{}, finish_};
  ++generated_;
  if (is_stop_token(token)) {
    // Bytes of an unfinished character still in the decoder come out as
    // U+FFFD, as decode() of the same ids would give.
    Step s = end(decoder_.finish(), FinishReason::Stop);
    if (s.stop_string < 0) s.stop_token = token;
    return s;
  }
  std::string piece = decoder_.push(token);
  if (max_tokens_ > 0 && generated_ >= max_tokens_) {
    piece += decoder_.finish();
    return end(piece, FinishReason::Length);
  }
  const auto r = strings_.push(piece);
  if (r.matched >= 0) finish_ = FinishReason::Stop;
  return {r.text, finish_, -1, r.matched};
}

StopMatcher::Step StopMatcher::finish(FinishReason reason) {
  if (finish_ != FinishReason::None) return {{}, finish_};
  return end(decoder_.finish(), reason);
}

}  // namespace kvant
