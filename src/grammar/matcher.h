// Matching a grammar (grammar.h) a byte at a time, as a deterministic
// automaton built lazily.
//
// A parse in progress is a stack of positions in the grammar (where the
// current alternative continues, and where each enclosing rule continues
// once it ends). Stacks are hash-consed: a stack is a node (position,
// parent node), so equal stacks are the same node id and pushing shares
// the parent. A rule reference in the last place of an alternative does not
// push (the call is a tail call), so repetition, which the builder writes
// as right recursion, keeps the stack the same height: the state inside a
// long string is the same state after every character.
//
// A state is the set of stacks whose top is a terminal (a byte set or a
// token), plus whether the input so far is a whole sentence. States are
// interned, and each state's transitions are remembered per byte value, so
// after warm-up a byte costs one table look-up; this is what makes the
// token masks of token_constraint.h cheap. Ambiguous grammars simply carry
// several stacks in a state.
//
// Not thread-safe: callers serialize (token_constraint.h holds a mutex).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "grammar/grammar.h"

namespace kvant::grammar {

struct MatcherLimits {
  size_t max_nodes = 4u << 20;
  size_t max_states = 1u << 14;  // each keeps a 1 KiB transition row
};

class Matcher {
 public:
  static constexpr int32_t kDead = -1;      // no sentence continues this way
  static constexpr int32_t kTooLarge = -2;  // a limit was reached
  static constexpr int32_t kUnknown = -3;   // (internal) transition not yet built

  explicit Matcher(std::shared_ptr<const Grammar> g, MatcherLimits limits = MatcherLimits());

  const Grammar& grammar() const { return *g_; }
  int32_t start() const { return start_; }  // kTooLarge when even that failed
  // The state after `b`, or kDead / kTooLarge.
  int32_t step(int32_t state, uint8_t b) {
    const int32_t n = (*states_[size_t(state)].next)[b];
    return n != kUnknown ? n : build_step(state, b);
  }
  // The state after the special token `token` (a Token element).
  int32_t step_token(int32_t state, int32_t token);
  int32_t step_bytes(int32_t state, std::string_view bytes);
  // Whether the input so far is a whole sentence.
  bool accepting(int32_t state) const { return states_[size_t(state)].accept; }
  // The special tokens that may come next.
  std::span<const int32_t> tokens(int32_t state) const { return states_[size_t(state)].tokens; }
  // The transition table row of a state (entries kUnknown until built).
  const std::array<int32_t, 256>& row(int32_t state) const { return *states_[size_t(state)].next; }
  int32_t build_step(int32_t state, uint8_t b);

  size_t state_count() const { return states_.size(); }
  size_t node_count() const { return nodes_.size(); }

 private:
  struct Node {
    uint32_t pos;
    int32_t parent;  // -1: the bottom of the stack (the start rule)
  };
  struct State {
    std::vector<int32_t> threads;  // sorted node ids whose position is a terminal
    std::vector<int32_t> tokens;   // sorted token ids of their Token terminals
    bool accept = false;
    std::unique_ptr<std::array<int32_t, 256>> next;
  };

  int32_t node(uint32_t pos, int32_t parent);
  // The continuation after the element at `pos` of a stack whose parent is
  // `parent`: the parent itself when the alternative ends there.
  int32_t continuation(uint32_t pos, int32_t parent);
  // Adds to `threads_` the terminal stacks reachable from `n` without
  // consuming input; sets accept_ when the whole start rule can end.
  bool close(int32_t n);
  int32_t intern();  // the state of threads_ / accept_

  std::shared_ptr<const Grammar> g_;
  MatcherLimits limits_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  int32_t start_ = kTooLarge;
  // Scratch of one transition.
  std::vector<int32_t> threads_, work_;
  std::vector<uint32_t> seen_;  // per node: the epoch it was last visited in
  uint32_t epoch_ = 0;
  bool accept_ = false;
};

}  // namespace kvant::grammar
