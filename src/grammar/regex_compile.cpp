// compile_regex (regex.h): a recursive-descent parser of ECMAScript-style
// patterns that builds grammar expressions directly.
#include <algorithm>

#include "grammar/regex.h"

namespace kvant::grammar {

namespace {

CharSet digit_set() { return CharSet::range('0', '9'); }

CharSet word_set() {
  CharSet s = CharSet::range('0', '9');
  s.add('A', 'Z');
  s.add('a', 'z');
  s.add('_', '_');
  return s;
}

// ECMAScript's \s: ASCII white space and the Unicode space separators.
CharSet space_set() {
  CharSet s = CharSet::range('\t', '\r');
  s.add(' ', ' ');
  s.add(0xA0, 0xA0);
  s.add(0x1680, 0x1680);
  s.add(0x2000, 0x200A);
  s.add(0x2028, 0x2029);
  s.add(0x202F, 0x202F);
  s.add(0x205F, 0x205F);
  s.add(0x3000, 0x3000);
  s.add(0xFEFF, 0xFEFF);
  return s;
}

CharSet dot_set() {
  CharSet nl = CharSet::of('\n');
  nl.add('\r', '\r');
  nl.add(0x2028, 0x2029);
  return nl.complement();
}

class RegexParser {
 public:
  RegexParser(std::string_view p, Grammar& g, const RegexOptions& o) : p_(p), g_(g), o_(o) {}

  Result<Expr> run() {
    std::vector<Expr> alts;
    while (true) {
      bool start_anchor = false, end_anchor = false;
      if (at('^')) {
        ++i_;
        start_anchor = true;
      }
      auto seq = sequence(&end_anchor);
      if (!seq) return seq.error();
      std::vector<Expr> parts;
      if (o_.search && !start_anchor) parts.push_back(any_star());
      parts.push_back(std::move(*seq));
      if (o_.search && !end_anchor) parts.push_back(any_star());
      alts.push_back(Expr::seq(std::move(parts)));
      if (i_ >= p_.size()) break;
      if (p_[i_] == '|') {
        ++i_;
        continue;
      }
      return fail("unbalanced ')'");
    }
    return Expr::alt(std::move(alts));
  }

 private:
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }
  Error fail(const std::string& why) const {
    return make_error("regular expression: " + why + " at offset " + std::to_string(i_));
  }

  Expr any_star() {
    if (any_rule_ < 0) {
      any_rule_ = g_.add_rule("anychar");
      auto e = charset_expr(CharSet::any(), o_.mode);
      (void)g_.define(any_rule_, *e);
    }
    return Expr::star(Expr::rule(any_rule_));
  }

  // A top-level alternative's sequence stops at '|' and the end; `end_anchor`
  // (top level only) receives a final '$'.
  Result<Expr> sequence(bool* end_anchor) {
    std::vector<Expr> items;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        ++i_;
        const bool last = i_ >= p_.size() || p_[i_] == '|';
        if (end_anchor == nullptr || !last) return fail("'$' is supported only at the end");
        *end_anchor = true;
        break;
      }
      auto a = atom();
      if (!a) return a.error();
      auto r = quantified(std::move(*a));
      if (!r) return r.error();
      items.push_back(std::move(*r));
    }
    return Expr::seq(std::move(items));
  }

  Result<Expr> group_alternation() {
    std::vector<Expr> alts;
    while (true) {
      auto s = sequence(nullptr);
      if (!s) return s.error();
      alts.push_back(std::move(*s));
      if (at('|')) {
        ++i_;
        continue;
      }
      if (at(')')) {
        ++i_;
        return Expr::alt(std::move(alts));
      }
      return fail("a group without its ')'");
    }
  }

  Result<uint32_t> number() {
    if (!(i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9')) return fail("a number expected");
    uint64_t v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + uint64_t(p_[i_++] - '0');
      if (v > o_.max_repeat) return fail("a repetition count above " + std::to_string(o_.max_repeat));
    }
    return uint32_t(v);
  }

  Result<Expr> quantified(Expr a) {
    while (i_ < p_.size()) {
      uint32_t lo = 0, hi = kUnbounded;
      const char c = p_[i_];
      if (c == '*') {
        ++i_;
      } else if (c == '+') {
        lo = 1;
        ++i_;
      } else if (c == '?') {
        hi = 1;
        ++i_;
      } else if (c == '{' && i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9') {
        ++i_;
        auto n = number();
        if (!n) return n.error();
        lo = hi = *n;
        if (at(',')) {
          ++i_;
          hi = kUnbounded;
          if (!at('}')) {
            auto m = number();
            if (!m) return m.error();
            hi = *m;
          }
        }
        if (!at('}')) return fail("a '{' repetition without its '}'");
        ++i_;
        if (hi != kUnbounded && hi < lo) return fail("a repetition {n,m} with m < n");
      } else {
        break;
      }
      if (at('?')) ++i_;  // lazy: the same strings
      a = Expr::repeat(std::move(a), lo, hi);
    }
    return a;
  }

  // Decodes one UTF-8 character of the pattern.
  uint32_t next_char() {
    const unsigned char c0 = uint8_t(p_[i_++]);
    if (c0 < 0x80) return c0;
    int n = c0 >= 0xF0 ? 3 : c0 >= 0xE0 ? 2 : 1;
    uint32_t c = c0 & (0x3F >> n);
    while (n-- > 0 && i_ < p_.size()) c = (c << 6) | (uint8_t(p_[i_++]) & 0x3F);
    return c;
  }

  Result<uint32_t> hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= p_.size()) return make_error("regular expression: a short \\x or \\u escape");
      const char d = p_[i_++];
      int x = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10
                                              : d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
      if (x < 0) return make_error("regular expression: a bad hex digit in an escape");
      v = v * 16 + uint32_t(x);
    }
    return v;
  }

  // After a backslash: a class (\d ...) or one character.
  Result<CharSet> escape() {
    if (i_ >= p_.size()) return make_error("regular expression: a trailing backslash");
    const char c = p_[i_];
    switch (c) {
      case 'd': ++i_; return digit_set();
      case 'D': ++i_; return digit_set().complement();
      case 'w': ++i_; return word_set();
      case 'W': ++i_; return word_set().complement();
      case 's': ++i_; return space_set();
      case 'S': ++i_; return space_set().complement();
      case 'n': ++i_; return CharSet::of('\n');
      case 't': ++i_; return CharSet::of('\t');
      case 'r': ++i_; return CharSet::of('\r');
      case 'f': ++i_; return CharSet::of('\f');
      case 'v': ++i_; return CharSet::of('\v');
      case '0': ++i_; return CharSet::of(0);
      case 'x': {
        ++i_;
        auto v = hex(2);
        if (!v) return v.error();
        return CharSet::of(*v);
      }
      case 'u': {
        ++i_;
        auto v = hex(4);
        if (!v) return v.error();
        return CharSet::of(*v);
      }
      case 'b': case 'B':
        return make_error("regular expression: word boundaries (\\b, \\B) are not supported");
      default:
        if (c >= '1' && c <= '9')
          return make_error("regular expression: back-references are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          return make_error(std::string("regular expression: unknown escape \\") + c);
        return CharSet::of(next_char());
    }
  }

  Result<CharSet> char_class() {
    bool negate = false;
    if (at('^')) {
      negate = true;
      ++i_;
    }
    CharSet set;
    bool first = true;
    while (i_ < p_.size() && (p_[i_] != ']' || first)) {
      first = false;
      CharSet lo_set;
      uint32_t lo = 0;
      bool single = true;
      if (p_[i_] == '\\') {
        ++i_;
        auto e = escape();
        if (!e) return e.error();
        lo_set = *e;
        single = lo_set.ranges.size() == 1 && lo_set.ranges[0].first == lo_set.ranges[0].second;
        if (single) lo = lo_set.ranges[0].first;
      } else {
        lo = next_char();
        lo_set = CharSet::of(lo);
      }
      if (single && at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        uint32_t hi;
        if (p_[i_] == '\\') {
          ++i_;
          auto e = escape();
          if (!e) return e.error();
          if (e->ranges.size() != 1 || e->ranges[0].first != e->ranges[0].second)
            return make_error("regular expression: a class escape as a range bound");
          hi = e->ranges[0].first;
        } else {
          hi = next_char();
        }
        if (hi < lo) return make_error("regular expression: a range out of order in a class");
        set.add(lo, hi);
        continue;
      }
      set.add(lo_set);
    }
    if (!at(']')) return make_error("regular expression: a class without its ']'");
    ++i_;
    return negate ? set.complement() : set;
  }

  Result<Expr> atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (at('?')) {
        ++i_;
        if (at(':')) {
          ++i_;
        } else if (at('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          while (i_ < p_.size() && p_[i_] != '>') ++i_;
          if (!at('>')) return fail("a group name without its '>'");
          ++i_;
        } else {
          return fail("look-around assertions are not supported");
        }
      }
      return group_alternation();
    }
    if (c == '*' || c == '+' || c == '?' ||
        (c == '{' && i_ + 1 < p_.size() && p_[i_ + 1] >= '0' && p_[i_ + 1] <= '9'))
      return fail("a repetition with nothing to repeat");
    if (c == '^') return fail("'^' is supported only at the start");
    CharSet set;
    if (c == '[') {
      ++i_;
      auto s = char_class();
      if (!s) return s.error();
      set = std::move(*s);
    } else if (c == '.') {
      ++i_;
      set = dot_set();
    } else if (c == '\\') {
      ++i_;
      auto s = escape();
      if (!s) return s.error();
      set = std::move(*s);
    } else {
      set = CharSet::of(next_char());
    }
    if (set.ranges.size() == 1 && set.ranges[0].first == set.ranges[0].second) {
      // One character: its spelling as a literal.
      uint32_t cp = set.ranges[0].first;
      std::string utf8;
      if (cp < 0x80) {
        utf8.push_back(char(cp));
      } else if (cp < 0x800) {
        utf8 += char(0xC0 | (cp >> 6));
        utf8 += char(0x80 | (cp & 0x3F));
      } else if (cp >= 0xD800 && cp <= 0xDFFF) {
        return fail("a surrogate code point");
      } else if (cp < 0x10000) {
        utf8 += char(0xE0 | (cp >> 12));
        utf8 += char(0x80 | ((cp >> 6) & 0x3F));
        utf8 += char(0x80 | (cp & 0x3F));
      } else {
        utf8 += char(0xF0 | (cp >> 18));
        utf8 += char(0x80 | ((cp >> 12) & 0x3F));
        utf8 += char(0x80 | ((cp >> 6) & 0x3F));
        utf8 += char(0x80 | (cp & 0x3F));
      }
      if (o_.mode == TextMode::JsonString && cp < 0x20) return charset_expr(set, o_.mode);
      if (o_.mode == TextMode::JsonString && cp == '/') return charset_expr(set, o_.mode);
      return Expr::lit(spell(utf8, o_.mode));
    }
    return charset_expr(set, o_.mode);
  }

  std::string_view p_;
  Grammar& g_;
  const RegexOptions& o_;
  size_t i_ = 0;
  int32_t any_rule_ = -1;
};

}  // namespace

Result<Expr> compile_regex(std::string_view pattern, Grammar& g, const RegexOptions& o) {
  RegexParser p(pattern, g, o);
  return p.run();
}

}  // namespace kvant::grammar
