// Grammar building: lowering expressions to alternatives, and the checks
// finish() makes (every rule defined, no left recursion).
#include "grammar/grammar.h"

#include <cstdio>

namespace kvant::grammar {

ByteSet ByteSet::of(uint8_t b) {
  ByteSet s;
  s.add(b);
  return s;
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return s;
}

void ByteSet::add_range(uint8_t lo, uint8_t hi) {
  for (unsigned b = lo; b <= hi; ++b) add(uint8_t(b));
}

ByteSet& ByteSet::operator|=(const ByteSet& o) {
  for (size_t i = 0; i < 4; ++i) bits[i] |= o.bits[i];
  return *this;
}

Expr Expr::bytes(const ByteSet& s) {
  Expr e;
  e.op = Op::Bytes;
  e.set = s;
  return e;
}

Expr Expr::lit(std::string_view text) {
  Expr e;
  e.op = text.empty() ? Op::Empty : Op::Literal;
  e.text = std::string(text);
  return e;
}

Expr Expr::rule(int32_t id) {
  Expr e;
  e.op = Op::Rule;
  e.id = id;
  return e;
}

Expr Expr::token(int32_t id) {
  Expr e;
  e.op = Op::Token;
  e.id = id;
  return e;
}

Expr Expr::seq(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.op = kids.empty() ? Op::Empty : Op::Seq;
  e.kids = std::move(kids);
  return e;
}

Expr Expr::alt(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.op = Op::Alt;
  e.kids = std::move(kids);
  return e;
}

Expr Expr::repeat(Expr x, uint32_t min, uint32_t max) {
  Expr e;
  e.op = Op::Repeat;
  e.min = min;
  e.max = max;
  e.kids.push_back(std::move(x));
  return e;
}

int32_t Grammar::add_rule(std::string name) {
  rules_.push_back(Rule{std::move(name), {}});
  return int32_t(rules_.size() - 1);
}

uint32_t Grammar::intern_set(const ByteSet& s) {
  // Grammars use few distinct sets; a linear search over the recent ones
  // keeps the table small without a hash.
  for (size_t i = sets_.size(); i-- > 0 && sets_.size() - i <= 64;)
    if (sets_[i] == s) return uint32_t(i);
  sets_.push_back(s);
  return uint32_t(sets_.size() - 1);
}

Result<void> Grammar::append_alt(int32_t id, const std::vector<Element>& seq) {
  if (elems_.size() + seq.size() + 1 > limits_.max_elements)
    return make_error("the grammar is too large (more than " +
                      std::to_string(limits_.max_elements) + " elements)");
  rules_[size_t(id)].alts.push_back(uint32_t(elems_.size()));
  elems_.insert(elems_.end(), seq.begin(), seq.end());
  elems_.push_back(Element{Element::Kind::End, 0});
  return {};
}

Result<void> Grammar::define(int32_t id, const Expr& e) {
  if (id < 0 || size_t(id) >= rules_.size()) return make_error("grammar: no rule " + std::to_string(id));
  if (e.op == Expr::Op::Alt) {
    for (const Expr& k : e.kids) KV_TRY(define(id, k));
    return {};
  }
  std::vector<Element> seq;
  KV_TRY(lower_element(e, seq));
  return append_alt(id, seq);
}

Result<int32_t> Grammar::lower_to_rule(const Expr& e, const char* what) {
  if (rules_.size() >= limits_.max_rules)
    return make_error("the grammar is too large (more than " + std::to_string(limits_.max_rules) +
                      " rules)");
  const int32_t r = add_rule(what);
  KV_TRY(define(r, e));
  return r;
}

Result<void> Grammar::lower_element(const Expr& e, std::vector<Element>& out) {
  using K = Element::Kind;
  switch (e.op) {
    case Expr::Op::Empty:
      return {};
    case Expr::Op::Bytes:
      if (e.set.empty()) return make_error("grammar: an empty byte set matches nothing");
      out.push_back(Element{K::Bytes, intern_set(e.set)});
      return {};
    case Expr::Op::Literal:
      for (unsigned char c : e.text) out.push_back(Element{K::Bytes, intern_set(ByteSet::of(c))});
      return {};
    case Expr::Op::Rule:
      if (e.id < 0 || size_t(e.id) >= rules_.size())
        return make_error("grammar: reference to an unknown rule");
      out.push_back(Element{K::Rule, uint32_t(e.id)});
      return {};
    case Expr::Op::Token:
      out.push_back(Element{K::Token, uint32_t(e.id)});
      return {};
    case Expr::Op::Seq:
      for (const Expr& k : e.kids) KV_TRY(lower_element(k, out));
      return {};
    case Expr::Op::Alt: {
      if (e.kids.empty()) return make_error("grammar: an alternative of nothing matches nothing");
      if (e.kids.size() == 1) return lower_element(e.kids[0], out);
      auto r = lower_to_rule(e, "alt");
      if (!r) return r.error();
      out.push_back(Element{K::Rule, uint32_t(*r)});
      return {};
    }
    case Expr::Op::Repeat:
      break;
  }
  // Repetition: the item once as an element (a rule when it is more than
  // one), `min` copies, then a right-recursive tail for what may follow.
  if (e.min > limits_.max_repeat || (e.max != kUnbounded && e.max > limits_.max_repeat))
    return make_error("a repetition bound above " + std::to_string(limits_.max_repeat));
  if (e.max != kUnbounded && e.max < e.min) return make_error("a repetition whose max is below its min");
  if (e.max == 0) return {};
  std::vector<Element> item;
  KV_TRY(lower_element(e.kids[0], item));
  if (item.size() != 1) {
    auto r = lower_to_rule(e.kids[0], "item");
    if (!r) return r.error();
    item.assign(1, Element{K::Rule, uint32_t(*r)});
  }
  for (uint32_t i = 0; i < e.min; ++i) out.push_back(item[0]);
  if (e.max == kUnbounded) {
    if (rules_.size() >= limits_.max_rules) return make_error("the grammar is too large");
    const int32_t s = add_rule("star");
    KV_TRY(append_alt(s, {item[0], Element{K::Rule, uint32_t(s)}}));
    KV_TRY(append_alt(s, {}));
    out.push_back(Element{K::Rule, uint32_t(s)});
    return {};
  }
  int32_t tail = -1;  // O_j ::= item O_{j-1} | empty, O_1 ::= item | empty
  for (uint32_t j = e.min; j < e.max; ++j) {
    if (rules_.size() >= limits_.max_rules) return make_error("the grammar is too large");
    const int32_t o = add_rule("upto");
    std::vector<Element> a{item[0]};
    if (tail >= 0) a.push_back(Element{K::Rule, uint32_t(tail)});
    KV_TRY(append_alt(o, a));
    KV_TRY(append_alt(o, {}));
    tail = o;
  }
  if (tail >= 0) out.push_back(Element{K::Rule, uint32_t(tail)});
  return {};
}

Result<void> Grammar::finish(int32_t root) {
  if (root < 0 || size_t(root) >= rules_.size()) return make_error("grammar: no start rule");
  const size_t n = rules_.size();
  for (size_t r = 0; r < n; ++r)
    if (rules_[r].alts.empty())
      return make_error("grammar: rule '" + rules_[r].name + "' has no alternative");
  // Nullable rules, to a fixed point.
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (uint32_t a : rules_[r].alts) {
        uint32_t p = a;
        while (elems_[p].kind == Element::Kind::Rule && nullable[elems_[p].arg]) ++p;
        if (elems_[p].kind == Element::Kind::End) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  // Left corners: A -> B when an alternative of A can begin with B. A cycle
  // is left recursion.
  std::vector<std::vector<uint32_t>> corners(n);
  for (size_t r = 0; r < n; ++r)
    for (uint32_t a : rules_[r].alts)
      for (uint32_t p = a; elems_[p].kind == Element::Kind::Rule; ++p) {
        corners[r].push_back(elems_[p].arg);
        if (!nullable[elems_[p].arg]) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (size_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    stack.push_back({uint32_t(s), 0});
    color[s] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i == corners[r].size()) {
        color[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t next = corners[r][i++];
      if (color[next] == 1)
        return make_error("grammar: rule '" + rules_[next].name + "' is left-recursive");
      if (color[next] == 0) {
        color[next] = 1;
        stack.push_back({next, 0});
      }
    }
  }
  root_ = root;
  return {};
}

namespace {

std::string set_text(const ByteSet& s) {
  std::string out = "[";
  char buf[8];
  for (unsigned b = 0; b < 256; ++b) {
    if (!s.has(uint8_t(b))) continue;
    unsigned e = b;
    while (e + 1 < 256 && s.has(uint8_t(e + 1))) ++e;
    auto put = [&](unsigned v) {
      if (v >= 0x21 && v < 0x7F && v != '\\' && v != ']' && v != '-') {
        out.push_back(char(v));
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02X", v);
        out += buf;
      }
    };
    put(b);
    if (e > b) {
      out.push_back('-');
      put(e);
    }
    b = e;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < rules_.size(); ++r) {
    out += rules_[r].name + std::to_string(r) + " ::=";
    for (size_t k = 0; k < rules_[r].alts.size(); ++k) {
      if (k) out += " |";
      for (uint32_t p = rules_[r].alts[k]; elems_[p].kind != Element::Kind::End; ++p) {
        const Element& e = elems_[p];
        out.push_back(' ');
        if (e.kind == Element::Kind::Bytes) out += set_text(sets_[e.arg]);
        if (e.kind == Element::Kind::Rule) out += rules_[e.arg].name + std::to_string(e.arg);
        if (e.kind == Element::Kind::Token) out += "<token " + std::to_string(e.arg) + ">";
      }
      if (elems_[rules_[r].alts[k]].kind == Element::Kind::End) out += " \"\"";
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace kvant::grammar
