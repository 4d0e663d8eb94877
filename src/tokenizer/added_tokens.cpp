// Trie walk for added tokens. The first-byte table skips most positions
// without touching the trie: in ordinary text few bytes can start a token.
#include "tokenizer/added_tokens.h"

namespace kvant {

void AddedTokenMatcher::add(std::string_view content, int32_t id, bool special) {
  if (content.empty()) return;
  int32_t node = 0;
  for (char c : content) {
    const uint64_t key = (uint64_t(uint32_t(node)) << 8) | uint8_t(c);
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      nodes_.push_back(Node{});
      it = edges_.emplace(key, int32_t(nodes_.size() - 1)).first;
    }
    node = it->second;
  }
  // Two ids with one content (a malformed vocabulary): keep the first.
  if (nodes_[size_t(node)].id < 0) nodes_[size_t(node)] = Node{id, special};
  first_byte_[uint8_t(content[0])] = true;
}

AddedTokenMatcher::Match AddedTokenMatcher::find(std::string_view text, size_t from,
                                                 bool parse_special) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[uint8_t(text[i])]) continue;
    Match best;
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, uint8_t(text[j]));
      if (node < 0) break;
      const Node& n = nodes_[size_t(node)];
      if (n.id >= 0 && (parse_special || !n.special)) best = Match{i, j + 1, n.id};
    }
    if (best.id >= 0) return best;
  }
  return Match{};
}

}  // namespace kvant
