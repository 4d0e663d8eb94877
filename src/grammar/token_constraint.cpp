// Token masks from the vocabulary trie (token_constraint.h).
#include "grammar/token_constraint.h"

#include <algorithm>
#include <limits>

namespace kvant::grammar {

std::shared_ptr<const VocabIndex> VocabIndex::build(const Tokenizer& tok) {
  auto v = std::make_shared<VocabIndex>();
  v->tok_.emplace(tok);
  v->vocab_ = tok.vocab_size();
  v->in_trie_.assign(size_t(v->vocab_), 0);
  std::vector<std::pair<std::string_view, int32_t>> pieces;
  for (int32_t id = 0; id < v->vocab_; ++id) {
    const TokenType t = tok.token_type(id);
    if (t == TokenType::Control) {
      v->special_.emplace(tok.token_text(id), id);
      continue;
    }
    if (t == TokenType::Unused || t == TokenType::Unknown) continue;
    const std::string& p = tok.token_piece(id);
    if (p.empty() || p.size() > 1024) continue;
    pieces.emplace_back(p, id);
    v->in_trie_[size_t(id)] = 1;
  }
  std::sort(pieces.begin(), pieces.end());
  std::vector<int32_t> path;  // the node at each depth of the previous piece
  std::string_view prev;
  for (const auto& [p, id] : pieces) {
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < p.size() && prev[lcp] == p[lcp]) ++lcp;
    while (path.size() > lcp) {
      v->end_[size_t(path.back())] = int32_t(v->byte_.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < p.size(); ++d) {
      path.push_back(int32_t(v->byte_.size()));
      v->byte_.push_back(uint8_t(p[d]));
      v->depth_.push_back(uint16_t(d + 1));
      v->end_.push_back(0);
      v->tok_begin_.push_back(int32_t(v->node_tokens_.size()));
    }
    // Sorted order puts a piece before its extensions and repeats of it
    // next to each other, so a node's tokens are appended before any later
    // node is made.
    v->node_tokens_.push_back(id);
    v->max_depth_ = std::max<uint16_t>(v->max_depth_, uint16_t(p.size()));
    prev = p;
  }
  for (int32_t n : path) v->end_[size_t(n)] = int32_t(v->byte_.size());
  v->tok_begin_.push_back(int32_t(v->node_tokens_.size()));
  v->eog_ = tok.eog_ids();
  return v;
}

std::optional<int32_t> VocabIndex::special_token(std::string_view text) const {
  auto it = special_.find(std::string(text));
  if (it == special_.end()) return std::nullopt;
  return it->second;
}

bool VocabIndex::is_eog(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

bool VocabIndex::bytes_of(int32_t id, std::string_view& out) const {
  if (id < 0 || id >= vocab_ || !in_trie_[size_t(id)]) return false;
  out = tok_->token_piece(id);
  return true;
}

// One request's position in a shared CompiledConstraint.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<CompiledConstraint> c, int32_t state)
      : c_(std::move(c)), state_(state) {}

  Result<void> mask(std::span<float> logits) override {
    std::lock_guard<std::mutex> lk(c_->mu_);
    auto bits = c_->mask_locked(state_);
    if (!bits) return bits.error();
    const std::vector<uint64_t>& m = **bits;
    const size_t v = std::min(logits.size(), size_t(c_->vocab_->vocab_size()));
    const float ninf = -std::numeric_limits<float>::infinity();
    bool any = false;
    for (size_t w = 0; w * 64 < v; ++w) {
      const uint64_t word = m[w];
      any |= word != 0;
      if (word == ~uint64_t(0)) continue;
      const size_t hi = std::min(v, w * 64 + 64);
      for (size_t i = w * 64; i < hi; ++i)
        if (!((word >> (i & 63)) & 1)) logits[i] = ninf;
    }
    for (size_t i = v; i < logits.size(); ++i) logits[i] = ninf;
    if (!any) return make_error("structured output: no token can continue the output");
    return {};
  }

  Result<void> accept(int32_t token) override {
    std::lock_guard<std::mutex> lk(c_->mu_);
    Matcher& m = c_->matcher_;
    const VocabIndex& v = *c_->vocab_;
    if (v.is_eog(token) && m.accepting(state_)) return {};
    std::string_view bytes;
    int32_t next = v.bytes_of(token, bytes) ? m.step_bytes(state_, bytes) : m.step_token(state_, token);
    if (next == Matcher::kTooLarge)
      return make_error("structured output: the grammar's automaton grew past its limit");
    if (next < 0)
      return make_error("structured output: token " + std::to_string(token) +
                        " does not fit the required format");
    state_ = next;
    return {};
  }

 private:
  std::shared_ptr<CompiledConstraint> c_;
  int32_t state_;
};

CompiledConstraint::CompiledConstraint(std::shared_ptr<const Grammar> g,
                                       std::shared_ptr<const VocabIndex> vocab, MatcherLimits limits)
    : vocab_(std::move(vocab)), matcher_(std::move(g), limits) {}

Result<std::unique_ptr<TokenConstraint>> CompiledConstraint::start() const {
  std::lock_guard<std::mutex> lk(mu_);
  const int32_t s = matcher_.start();
  if (s == Matcher::kTooLarge) return make_error("structured output: the grammar is too large");
  if (s < 0) return make_error("structured output: the grammar admits no output");
  auto self = std::const_pointer_cast<CompiledConstraint>(shared_from_this());
  return std::unique_ptr<TokenConstraint>(new GrammarConstraint(std::move(self), s));
}

bool CompiledConstraint::accepts(std::string_view text) const {
  std::lock_guard<std::mutex> lk(mu_);
  int32_t s = matcher_.start();
  if (s < 0) return false;
  s = matcher_.step_bytes(s, text);
  return s >= 0 && matcher_.accepting(s);
}

ConstraintStats CompiledConstraint::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  ConstraintStats st;
  st.states = matcher_.state_count();
  st.masks = masks_.size();
  st.mask_bytes = mask_bytes_;
  st.mask_hits = hits_;
  st.mask_misses = misses_;
  return st;
}

void CompiledConstraint::walk_locked(int32_t state, std::vector<uint64_t>& bits) {
  const VocabIndex& v = *vocab_;
  walk_states_.assign(size_t(v.max_depth_) + 1, Matcher::kDead);
  walk_states_[0] = state;
  const size_t n = v.byte_.size();
  size_t i = 0;
  while (i < n) {
    const size_t d = v.depth_[i];
    const int32_t ns = matcher_.step(walk_states_[d - 1], v.byte_[i]);
    if (ns < 0) {
      if (ns == Matcher::kTooLarge) walk_states_[0] = Matcher::kTooLarge;
      i = size_t(v.end_[i]);
      continue;
    }
    walk_states_[d] = ns;
    for (int32_t k = v.tok_begin_[i]; k < v.tok_begin_[i + 1]; ++k) {
      const int32_t t = v.node_tokens_[size_t(k)];
      bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    }
    ++i;
  }
  for (int32_t t : matcher_.tokens(state))
    if (t >= 0 && t < v.vocab_) bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
  if (matcher_.accepting(state))
    for (int32_t t : v.eog_)
      if (t >= 0 && t < v.vocab_) bits[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
}

Result<const std::vector<uint64_t>*> CompiledConstraint::mask_locked(int32_t state) {
  auto it = masks_.find(state);
  if (it != masks_.end()) {
    ++hits_;
    return &it->second;
  }
  ++misses_;
  std::vector<uint64_t> bits((size_t(vocab_->vocab_) + 63) / 64, 0);
  walk_locked(state, bits);
  if (walk_states_[0] == Matcher::kTooLarge)
    return make_error("structured output: the grammar's automaton grew past its limit");
  const size_t bytes = bits.size() * sizeof(uint64_t);
  if (mask_bytes_ + bytes > kMaxMaskBytes) {
    masks_.clear();
    mask_bytes_ = 0;
  }
  mask_bytes_ += bytes;
  return &masks_.emplace(state, std::move(bits)).first->second;
}

}  // namespace kvant::grammar
