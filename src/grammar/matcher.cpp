// The lazily built automaton of matcher.h.
#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>

namespace kvant::grammar {

Matcher::Matcher(std::shared_ptr<const Grammar> g, MatcherLimits limits)
    : g_(std::move(g)), limits_(limits) {
  if (g_->root() < 0) return;
  threads_.clear();
  accept_ = false;
  ++epoch_;
  for (uint32_t a : g_->alternatives(g_->root())) {
    const int32_t n = node(a, -1);
    if (n < 0 || !close(n)) return;
  }
  start_ = intern();
}

int32_t Matcher::node(uint32_t pos, int32_t parent) {
  const uint64_t key = uint64_t(pos) << 32 | uint32_t(parent + 1);
  auto [it, fresh] = node_ids_.try_emplace(key, int32_t(nodes_.size()));
  if (fresh) {
    if (nodes_.size() >= limits_.max_nodes) {
      node_ids_.erase(it);
      return kTooLarge;
    }
    nodes_.push_back(Node{pos, parent});
    seen_.push_back(0);
  }
  return it->second;
}

int32_t Matcher::continuation(uint32_t pos, int32_t parent) {
  if (g_->element(pos + 1).kind == Element::Kind::End) return parent;  // a tail call
  return node(pos + 1, parent);
}

bool Matcher::close(int32_t start) {
  work_.clear();
  work_.push_back(start);
  while (!work_.empty()) {
    const int32_t n = work_.back();
    work_.pop_back();
    if (n == -1) {
      accept_ = true;
      continue;
    }
    if (seen_[size_t(n)] == epoch_) continue;
    seen_[size_t(n)] = epoch_;
    const Node nd = nodes_[size_t(n)];
    const Element& e = g_->element(nd.pos);
    switch (e.kind) {
      case Element::Kind::Bytes:
      case Element::Kind::Token:
        threads_.push_back(n);
        break;
      case Element::Kind::End:
        work_.push_back(nd.parent);
        break;
      case Element::Kind::Rule: {
        const int32_t k = continuation(nd.pos, nd.parent);
        if (k == kTooLarge) return false;
        for (uint32_t a : g_->alternatives(int32_t(e.arg))) {
          const int32_t c = node(a, k);
          if (c < 0) return false;
          work_.push_back(c);
        }
        break;
      }
    }
  }
  return true;
}

int32_t Matcher::intern() {
  std::sort(threads_.begin(), threads_.end());
  threads_.erase(std::unique(threads_.begin(), threads_.end()), threads_.end());
  if (threads_.empty() && !accept_) return kDead;
  std::string key(threads_.size() * sizeof(int32_t) + 1, '\0');
  if (!threads_.empty()) std::memcpy(key.data(), threads_.data(), threads_.size() * sizeof(int32_t));
  key.back() = accept_ ? 1 : 0;
  auto it = state_ids_.find(key);
  if (it != state_ids_.end()) return it->second;
  if (states_.size() >= limits_.max_states) return kTooLarge;
  State s;
  s.threads = threads_;
  s.accept = accept_;
  for (int32_t n : threads_) {
    const Element& e = g_->element(nodes_[size_t(n)].pos);
    if (e.kind == Element::Kind::Token) s.tokens.push_back(int32_t(e.arg));
  }
  std::sort(s.tokens.begin(), s.tokens.end());
  s.tokens.erase(std::unique(s.tokens.begin(), s.tokens.end()), s.tokens.end());
  s.next = std::make_unique<std::array<int32_t, 256>>();
  s.next->fill(kUnknown);
  states_.push_back(std::move(s));
  const int32_t id = int32_t(states_.size() - 1);
  state_ids_.emplace(std::move(key), id);
  return id;
}

int32_t Matcher::build_step(int32_t state, uint8_t b) {
  threads_.clear();
  accept_ = false;
  ++epoch_;
  // Copy: interning may grow states_ and move the source state's vectors.
  const std::vector<int32_t> from = states_[size_t(state)].threads;
  int32_t out = kDead;
  bool ok = true;
  for (int32_t n : from) {
    const Node nd = nodes_[size_t(n)];
    const Element& e = g_->element(nd.pos);
    if (e.kind != Element::Kind::Bytes || !g_->byte_set(e.arg).has(b)) continue;
    const int32_t k = continuation(nd.pos, nd.parent);
    if (k == kTooLarge || !close(k)) {
      ok = false;
      break;
    }
  }
  out = ok ? intern() : kTooLarge;
  if (out != kTooLarge) (*states_[size_t(state)].next)[b] = out;
  return out;
}

int32_t Matcher::step_token(int32_t state, int32_t token) {
  threads_.clear();
  accept_ = false;
  ++epoch_;
  const std::vector<int32_t> from = states_[size_t(state)].threads;
  for (int32_t n : from) {
    const Node nd = nodes_[size_t(n)];
    const Element& e = g_->element(nd.pos);
    if (e.kind != Element::Kind::Token || int32_t(e.arg) != token) continue;
    const int32_t k = continuation(nd.pos, nd.parent);
    if (k == kTooLarge || !close(k)) return kTooLarge;
  }
  return intern();
}

int32_t Matcher::step_bytes(int32_t state, std::string_view bytes) {
  for (unsigned char c : bytes) {
    state = step(state, c);
    if (state < 0) return state;
  }
  return state;
}

}  // namespace kvant::grammar
