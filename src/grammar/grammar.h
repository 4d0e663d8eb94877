// Context-free grammars over bytes, the form every output constraint is
// compiled to (JSON schemas, regular expressions, choice lists, tool-call
// layouts). A grammar is a set of rules; a rule is a list of alternatives;
// an alternative is a sequence of elements, each a set of bytes, a
// reference to a rule, or one vocabulary token by id (a special token such
// as <|tool_call_begin|> that has no byte spelling the model would use).
//
// Compilers build expressions (Expr: sequences, alternatives, repetition,
// literals, byte sets, rule references) and define rules with them; the
// builder lowers each expression to plain alternatives, adding helper rules
// for nested alternatives and repetition (right-recursive, so a rule never
// begins with itself). Left recursion is refused when the grammar is
// finished, since the matcher (grammar/matcher.h) expands rules eagerly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace kvant::grammar {

// 256 bits: which byte values an element accepts.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  static ByteSet of(uint8_t b);
  static ByteSet range(uint8_t lo, uint8_t hi);
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi);
  ByteSet& operator|=(const ByteSet& o);
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet& o) const { return bits == o.bits; }
};

inline constexpr uint32_t kUnbounded = 0xFFFFFFFFu;

// An expression over bytes, rules and tokens.
struct Expr {
  enum class Op : uint8_t { Empty, Bytes, Literal, Rule, Token, Seq, Alt, Repeat };
  Op op = Op::Empty;
  ByteSet set;               // Bytes
  std::string text;          // Literal
  int32_t id = -1;           // Rule: rule id; Token: token id
  uint32_t min = 0, max = 0; // Repeat: kids[0] min..max times (max kUnbounded: no limit)
  std::vector<Expr> kids;    // Seq, Alt, Repeat

  static Expr empty() { return Expr(); }
  static Expr bytes(const ByteSet& s);
  static Expr byte_range(uint8_t lo, uint8_t hi) { return bytes(ByteSet::range(lo, hi)); }
  static Expr lit(std::string_view text);
  static Expr rule(int32_t id);
  static Expr token(int32_t id);
  static Expr seq(std::vector<Expr> kids);
  static Expr alt(std::vector<Expr> kids);
  static Expr repeat(Expr x, uint32_t min, uint32_t max);
  static Expr star(Expr x) { return repeat(std::move(x), 0, kUnbounded); }
  static Expr plus(Expr x) { return repeat(std::move(x), 1, kUnbounded); }
  static Expr opt(Expr x) { return repeat(std::move(x), 0, 1); }
};

struct Element {
  enum class Kind : uint8_t { End, Bytes, Rule, Token };
  Kind kind = Kind::End;
  uint32_t arg = 0;  // Bytes: index into byte_sets(); Rule: rule id; Token: token id
};

// Limits on what one grammar may grow to, so a hostile schema fails to
// compile with a message instead of exhausting memory.
struct GrammarLimits {
  size_t max_elements = 4u << 20;
  size_t max_rules = 1u << 20;
  uint32_t max_repeat = 4096;  // a bounded repetition's upper bound
};

class Grammar {
 public:
  explicit Grammar(GrammarLimits limits = GrammarLimits()) : limits_(limits) {}

  // A new rule without alternatives yet (define it later; references to it
  // may be made before, which is how recursive rules are written).
  int32_t add_rule(std::string name);
  // Adds `e`'s alternatives to rule `id`. Errors once a limit is passed.
  Result<void> define(int32_t id, const Expr& e);
  // Checks that every rule has an alternative and none is left-recursive;
  // `root` becomes the start rule.
  Result<void> finish(int32_t root);

  int32_t root() const { return root_; }
  size_t rule_count() const { return rules_.size(); }
  size_t element_count() const { return elems_.size(); }
  const Element& element(uint32_t pos) const { return elems_[pos]; }
  const ByteSet& byte_set(uint32_t i) const { return sets_[i]; }
  // Positions of the first element of each alternative of rule `id`.
  const std::vector<uint32_t>& alternatives(int32_t id) const { return rules_[size_t(id)].alts; }
  const std::string& rule_name(int32_t id) const { return rules_[size_t(id)].name; }
  // The grammar in a BNF-like text, for tests and error reports.
  std::string to_string() const;

 private:
  struct Rule {
    std::string name;
    std::vector<uint32_t> alts;
  };
  Result<void> lower_alternative(const Expr& e, std::vector<Element>& out);
  Result<void> lower_element(const Expr& e, std::vector<Element>& out);
  Result<int32_t> lower_to_rule(const Expr& e, const char* what);
  Result<void> append_alt(int32_t id, const std::vector<Element>& seq);
  uint32_t intern_set(const ByteSet& s);

  GrammarLimits limits_;
  std::vector<Rule> rules_;
  std::vector<Element> elems_;
  std::vector<ByteSet> sets_;
  int32_t root_ = -1;
};

}  // namespace kvant::grammar
