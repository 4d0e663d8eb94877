// Finds added tokens (special/control and user-defined) in raw text before
// BPE runs, with HF's leftmost-longest rule: the match that starts first wins,
// and of those the longest. Special tokens can be switched off per call
// (parse_special = false) while user-defined ones are always matched, as both
// HF (encode_special_tokens) and llama.cpp do. A byte trie; no normalization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvant {

class AddedTokenMatcher {
 public:
  void add(std::string_view content, int32_t id, bool special);

  struct Match {
    size_t begin = 0, end = 0;
    int32_t id = -1;
  };
  // The first match at or after `from`; id -1 when there is none.
  Match find(std::string_view text, size_t from, bool parse_special) const;

  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    int32_t id = -1;  // token ending here, if any
    bool special = false;
  };
  int32_t child(int32_t node, uint8_t byte) const {
    auto it = edges_.find((uint64_t(uint32_t(node)) << 8) | byte);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<Node> nodes_{Node{}};
  std::unordered_map<uint64_t, int32_t> edges_;
  bool first_byte_[256] = {};
};

}  // namespace kvant
