// Characters and regular expressions as grammar expressions (grammar.h).
//
// A CharSet is a set of Unicode scalar values; charset_expr() spells it in
// bytes, either as raw UTF-8 text or as the inside of a JSON string, where
// '"', '\' and control characters must be escaped (\" \\ \n \u001f ...).
// compile_regex() turns an ECMAScript-style pattern (the dialect JSON
// Schema's "pattern" uses) into an expression over the same spellings:
// literals, '.', classes with ranges and negation, \d \w \s and their
// negations, \xHH \uHHHH escapes, groups (capturing, (?:...), (?<name>...)),
// alternation, * + ? {n} {n,} {n,m} (a lazy '?' suffix matches the same
// strings), and ^ / $ at the ends of a top-level alternative. Look-around,
// back-references and word boundaries are refused with a message: a
// grammar cannot express them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "grammar/grammar.h"

namespace kvant::grammar {

struct CharSet {
  // Sorted, disjoint, non-adjacent ranges of code points (inclusive).
  std::vector<std::pair<uint32_t, uint32_t>> ranges;

  static CharSet of(uint32_t c) { return range(c, c); }
  static CharSet range(uint32_t lo, uint32_t hi);
  static CharSet any();  // every scalar value (surrogates excluded)
  void add(uint32_t lo, uint32_t hi);
  void add(const CharSet& o);
  CharSet complement() const;  // within any()
  bool contains(uint32_t c) const;
  bool empty() const { return ranges.empty(); }
};

enum class TextMode { Raw, JsonString };

// The expression matching one character of `set`, spelled for `mode`.
Result<Expr> charset_expr(const CharSet& set, TextMode mode);
// The bytes of `text` spelled for `mode` (JSON: escaped as a JSON string's inside).
std::string spell(std::string_view text, TextMode mode);

struct RegexOptions {
  TextMode mode = TextMode::Raw;
  // true: the pattern may match anywhere in the text (JSON Schema's
  // "pattern"), unless anchored with ^ / $; false: it must match all of it.
  bool search = false;
  uint32_t max_repeat = 1024;
};

// The expression for the strings the pattern matches. Rules for '.' and the
// like are added to `g`.
Result<Expr> compile_regex(std::string_view pattern, Grammar& g, const RegexOptions& o);

}  // namespace kvant::grammar
