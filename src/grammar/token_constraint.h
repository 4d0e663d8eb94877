// Grammars enforced on a model's tokens: which vocabulary tokens may come
// next in a state of the grammar's automaton (matcher.h).
//
// The vocabulary's byte strings are kept as a trie in depth-first order
// (VocabIndex, one per tokenizer). A state's mask is one walk of the trie
// that carries the automaton state down each branch and skips a whole
// subtree the moment a byte is refused; tokens ending at a node still alive
// are allowed. Special (control) tokens are not in the trie: one may come
// next only where the grammar names it (a Token element), and the
// end-of-generation tokens only where the output may end.
//
// Masks are remembered per automaton state in the CompiledConstraint,
// which every request with the same grammar shares (the server caches them
// per schema): inside a string or a number the state repeats token after
// token, so most steps cost a look-up and one pass over the logits.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "engine/constraint.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace kvant::grammar {

class VocabIndex {
 public:
  static std::shared_ptr<const VocabIndex> build(const Tokenizer& tok);

  int32_t vocab_size() const { return vocab_; }
  // A control token whose text is exactly `text` (for grammar literals that
  // must be that token, such as <|tool_calls_section_begin|>).
  std::optional<int32_t> special_token(std::string_view text) const;
  bool is_eog(int32_t id) const;
  // The bytes a non-special token stands for; false for special tokens and
  // tokens outside the trie (empty, unused).
  bool bytes_of(int32_t id, std::string_view& out) const;
  size_t trie_nodes() const { return byte_.size(); }

 private:
  friend class CompiledConstraint;
  std::optional<Tokenizer> tok_;
  int32_t vocab_ = 0;
  // The trie in depth-first order: node i's byte, depth (1 for the first
  // byte), the index after its subtree, and the tokens ending there
  // (node_tokens_[tok_begin_[i], tok_begin_[i + 1])).
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<int32_t> end_;
  std::vector<int32_t> tok_begin_;
  std::vector<int32_t> node_tokens_;
  std::vector<uint8_t> in_trie_;  // per token id
  std::vector<int32_t> eog_;
  std::unordered_map<std::string, int32_t> special_;
  uint16_t max_depth_ = 0;
};

struct ConstraintStats {
  size_t states = 0, masks = 0, mask_bytes = 0;
  int64_t mask_hits = 0, mask_misses = 0;
};

// A grammar bound to a vocabulary, with its automaton and masks; shared.
class CompiledConstraint : public std::enable_shared_from_this<CompiledConstraint> {
 public:
  CompiledConstraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const VocabIndex> vocab,
                     MatcherLimits limits = MatcherLimits());

  // A constraint for one request, at the grammar's start.
  Result<std::unique_ptr<TokenConstraint>> start() const;
  // Whether `text` (bytes, no special tokens) is a whole sentence of the
  // grammar; for tests and validation.
  bool accepts(std::string_view text) const;
  ConstraintStats stats() const;
  const VocabIndex& vocab() const { return *vocab_; }

 private:
  friend class GrammarConstraint;
  // The allowed-token bits of `state` (vocab_size bits); valid until the
  // next call. Requires mu_.
  Result<const std::vector<uint64_t>*> mask_locked(int32_t state);
  void walk_locked(int32_t state, std::vector<uint64_t>& bits);

  std::shared_ptr<const VocabIndex> vocab_;
  mutable std::mutex mu_;
  mutable Matcher matcher_;
  std::unordered_map<int32_t, std::vector<uint64_t>> masks_;
  size_t mask_bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
  std::vector<int32_t> walk_states_;
  // Masks kept per grammar; beyond it they are forgotten and rebuilt.
  static constexpr size_t kMaxMaskBytes = size_t(32) << 20;
};

}  // namespace kvant::grammar
