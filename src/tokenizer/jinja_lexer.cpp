// The Jinja lexer, following jinja2's (lexer.py) with the settings
// transformers renders chat templates under: trim_blocks (the newline right
// after a block or comment tag is dropped) and lstrip_blocks (spaces and
// tabs from the start of a line up to a block or comment tag are dropped),
// plus the explicit controls {%- -%} {{- -}} {#- -#} and {%+ +%}.
#include <charconv>
#include <cstring>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace kvant::jinja {

std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || uint8_t(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
bool starts(const std::string& s, size_t p, std::string_view what) {
  return s.compare(p, what.size(), what) == 0;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}
  std::vector<Token> run();

 private:
  [[noreturn]] void fail(std::string msg, size_t pos) { throw SyntaxError{std::move(msg), pos}; }
  void emit(Token::Kind k, size_t pos, std::string text = {}) {
    out_.push_back(Token{k, pos, std::move(text)});
  }
  // Text before a tag, with the tag's whitespace control applied.
  void emit_data(size_t from, size_t to, char sign, bool lstrip_ok);
  size_t raw_begin_end(size_t open) const;
  size_t lex_comment(size_t p, char sign);
  size_t lex_raw(size_t p);
  size_t lex_tag(size_t p, bool block);
  size_t lex_number(size_t p);
  size_t lex_string(size_t p);
  size_t lex_operator(size_t p, std::vector<char>& brackets);
  size_t skip_ws(size_t p) const { return skip_space(s_, p); }

  const std::string& s_;
  std::vector<Token> out_;
  bool line_starting_ = true;  // the last match ended with a newline
};

void Lexer::emit_data(size_t from, size_t to, char sign, bool lstrip_ok) {
  std::string_view text(s_.data() + from, to - from);
  if (sign == '-') {
    text = py_strip(text, false, true);
  } else if (sign != '+' && lstrip_ok) {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size() && is_all_space(text.substr(l_pos)))
      text = text.substr(0, l_pos);
  }
  if (!text.empty()) emit(Token::Data, from, std::string(text));
}

// The end of a "{% raw %}" tag starting at `open`, or npos when the block
// tag there is something else.
size_t Lexer::raw_begin_end(size_t open) const {
  size_t p = open + 2;
  if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
  p = skip_ws(p);
  if (!starts(s_, p, "raw")) return std::string::npos;
  p = skip_ws(p + 3);
  if (starts(s_, p, "-%}")) return skip_ws(p + 3);
  if (starts(s_, p, "%}")) return p + 2;
  return std::string::npos;
}

std::vector<Token> Lexer::run() {
  size_t pos = 0;
  while (pos < s_.size()) {
    size_t open = pos;
    while ((open = s_.find('{', open)) != std::string::npos) {
      const char c = open + 1 < s_.size() ? s_[open + 1] : 0;
      if (c == '{' || c == '%' || c == '#') break;
      ++open;
    }
    if (open == std::string::npos) {
      emit(Token::Data, pos, s_.substr(pos));
      break;
    }
    const char kind = s_[open + 1];
    char sign = 0;
    if (open + 2 < s_.size() && (s_[open + 2] == '-' || s_[open + 2] == '+')) sign = s_[open + 2];
    emit_data(pos, open, sign, kind != '{');
    const size_t body = open + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      pos = lex_comment(body, sign);
    } else if (const size_t raw = kind == '%' ? raw_begin_end(open) : std::string::npos;
               raw != std::string::npos) {
      line_starting_ = s_[raw - 1] == '\n';
      pos = lex_raw(raw);
    } else {
      emit(kind == '%' ? Token::BlockBegin : Token::VarBegin, open);
      line_starting_ = false;
      pos = lex_tag(body, kind == '%');
    }
  }
  emit(Token::Eof, s_.size());
  return std::move(out_);
}

size_t Lexer::lex_comment(size_t p, char) {
  const size_t end = s_.find("#}", p);
  if (end == std::string::npos) fail("Missing end of comment tag", p);
  size_t q = end + 2;
  const char before = end > p ? s_[end - 1] : 0;
  if (before == '-') {
    q = skip_ws(q);
  } else if (before != '+' && q < s_.size() && s_[q] == '\n') {
    ++q;  // trim_blocks
  }
  line_starting_ = s_[q - 1] == '\n';
  return q;
}

// Text up to {% endraw %} is data, taken as it is.
size_t Lexer::lex_raw(size_t p) {
  size_t q = p;
  while ((q = s_.find("{%", q)) != std::string::npos) {
    size_t r = q + 2;
    char sign = 0;
    if (r < s_.size() && (s_[r] == '-' || s_[r] == '+')) sign = s_[r++];
    r = skip_ws(r);
    if (starts(s_, r, "endraw")) {
      r = skip_ws(r + 6);
      size_t end = std::string::npos;
      if (starts(s_, r, "+%}")) {
        end = r + 3;
      } else if (starts(s_, r, "-%}")) {
        end = skip_ws(r + 3);
      } else if (starts(s_, r, "%}")) {
        end = r + 2;
        if (end < s_.size() && s_[end] == '\n') ++end;
      }
      if (end != std::string::npos) {
        emit_data(p, q, sign, true);
        line_starting_ = s_[end - 1] == '\n';
        return end;
      }
    }
    q += 2;
  }
  fail("Missing end of raw directive", p);
}

size_t Lexer::lex_tag(size_t p, bool block) {
  std::vector<char> brackets;  // closers expected, innermost last
  for (;;) {
    if (brackets.empty()) {
      size_t end = std::string::npos;
      if (block) {
        if (starts(s_, p, "+%}")) {
          end = p + 3;
        } else if (starts(s_, p, "-%}")) {
          end = skip_ws(p + 3);
        } else if (starts(s_, p, "%}")) {
          end = p + 2;
          if (end < s_.size() && s_[end] == '\n') ++end;  // trim_blocks
        }
      } else if (starts(s_, p, "-}}")) {
        end = skip_ws(p + 3);
      } else if (starts(s_, p, "}}")) {
        end = p + 2;
      }
      if (end != std::string::npos) {
        emit(block ? Token::BlockEnd : Token::VarEnd, p);
        line_starting_ = s_[end - 1] == '\n';
        return end;
      }
    }
    const size_t q = skip_ws(p);
    if (q != p) {
      p = q;
      continue;
    }
    if (p >= s_.size())
      fail(std::string("unexpected end of template, expected '") + (block ? "%}" : "}}") + "'", p);
    const char c = s_[p];
    if (is_digit(c)) {
      p = lex_number(p);
    } else if (is_name_start(c)) {
      size_t e = p;
      while (e < s_.size() && is_name_char(s_[e])) ++e;
      emit(Token::Name, p, s_.substr(p, e - p));
      p = e;
    } else if (c == '\'' || c == '"') {
      p = lex_string(p);
    } else {
      p = lex_operator(p, brackets);
    }
  }
}

// Digits with single underscores between them, from p; returns the end or p.
size_t scan_digits(const std::string& s, size_t p, int base = 10) {
  auto ok = [&](char c) {
    if (base == 16) return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    return c >= '0' && c < char('0' + base);
  };
  size_t e = p;
  while (e < s.size() && ok(s[e])) {
    ++e;
    if (e + 1 < s.size() && s[e] == '_' && ok(s[e + 1])) ++e;
  }
  return e;
}

size_t Lexer::lex_number(size_t p) {
  // Floats first: digits with a fraction and/or exponent, not right after a
  // '.' (so that x.0.1 is two subscripts).
  if (p == 0 || s_[p - 1] != '.') {
    const size_t int_end = scan_digits(s_, p);
    size_t e = int_end;
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && is_digit(s_[e + 1])) {
      e = scan_digits(s_, e + 1);
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t x = e + 1;
      if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
      if (x < s_.size() && is_digit(s_[x])) {
        e = scan_digits(s_, x);
        is_float = true;
      }
    }
    if (is_float) {
      std::string text;
      for (size_t i = p; i < e; ++i)
        if (s_[i] != '_') text += s_[i];
      Token t{Token::Float, p, text};
      std::from_chars(text.data(), text.data() + text.size(), t.f);
      out_.push_back(std::move(t));
      return e;
    }
  }
  int base = 10;
  size_t start = p, e;
  if (s_[p] == '0' && p + 1 < s_.size() && std::strchr("bBoOxX", s_[p + 1]) && s_[p + 1] != 0) {
    const char b = char(s_[p + 1] | 0x20);
    base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
    start = p + 2;
    if (start < s_.size() && s_[start] == '_') ++start;
    e = scan_digits(s_, start, base);
    if (e == start) fail("invalid integer literal", p);
  } else if (s_[p] == '0') {
    e = p + 1;
    while (e + 1 < s_.size() && (s_[e] == '0' || (s_[e] == '_' && s_[e + 1] == '0'))) ++e;
  } else {
    e = scan_digits(s_, p);
  }
  std::string digits;
  for (size_t i = start; i < e; ++i)
    if (s_[i] != '_') digits += s_[i];
  Token t{Token::Int, p, s_.substr(p, e - p)};
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), t.i, base);
  if (r.ec != std::errc()) fail("integer literal out of range (64 bits)", p);
  out_.push_back(std::move(t));
  return e;
}

void append_hex_escape(uint32_t c, std::string& out) {
  char buf[16];
  if (c < 0x100)
    std::snprintf(buf, sizeof(buf), "x%02x", unsigned(c));
  else if (c < 0x10000)
    std::snprintf(buf, sizeof(buf), "u%04x", unsigned(c));
  else
    std::snprintf(buf, sizeof(buf), "U%08x", unsigned(c));
  out += buf;
}

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view b, size_t pos) {
  std::string out;
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] != '\\' || i + 1 == b.size()) {
      out += b[i];
      continue;
    }
    const char c = b[++i];
    auto hex = [&](int n) -> uint32_t {
      if (i + size_t(n) >= b.size()) throw SyntaxError{"truncated escape in string literal", pos};
      uint32_t v = 0;
      auto r = std::from_chars(b.data() + i + 1, b.data() + i + 1 + n, v, 16);
      if (r.ptr != b.data() + i + 1 + n)
        throw SyntaxError{"truncated escape in string literal", pos};
      i += size_t(n);
      return v;
    };
    switch (c) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        utf8::append_code_point(hex(2), out);
        break;
      case 'u':
        utf8::append_code_point(hex(4), out);
        break;
      case 'U': {
        const uint32_t v = hex(8);
        if (v > 0x10FFFF) throw SyntaxError{"illegal Unicode character in string literal", pos};
        utf8::append_code_point(v, out);
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          int n = 0;
          while (n < 3 && i < b.size() && b[i] >= '0' && b[i] <= '7')
            v = v * 8 + uint32_t(b[i++] - '0'), ++n;
          --i;
          utf8::append_code_point(v, out);
        } else if (uint8_t(c) >= 0x80) {
          // A backslash before a non-ASCII character escapes the backslash
          // of that character's \x/\u spelling (Python's backslashreplace).
          size_t len;
          const uint32_t cp = code_point_at(b, i, len);
          out += '\\';
          append_hex_escape(cp, out);
          i += len - 1;
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

size_t Lexer::lex_string(size_t p) {
  const char q = s_[p];
  size_t e = p + 1;
  while (e < s_.size() && s_[e] != q) e += s_[e] == '\\' ? 2 : 1;
  if (e >= s_.size()) fail(std::string("unexpected char '") + q + "'", p);
  emit(Token::String, p, unescape(std::string_view(s_).substr(p + 1, e - p - 1), p));
  return e + 1;
}

size_t Lexer::lex_operator(size_t p, std::vector<char>& brackets) {
  static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
  for (std::string_view op : kTwo) {
    if (starts(s_, p, op)) {
      emit(Token::Op, p, std::string(op));
      return p + 2;
    }
  }
  const char c = s_[p];
  if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0) {
    size_t len;
    code_point_at(s_, p, len);
    fail("unexpected char '" + s_.substr(p, len) + "'", p);
  }
  if (c == '(' || c == '[' || c == '{') {
    if (brackets.size() >= 256) fail("brackets nested too deeply", p);
    brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
  } else if (c == ')' || c == ']' || c == '}') {
    if (brackets.empty()) fail(std::string("unexpected '") + c + "'", p);
    if (brackets.back() != c)
      fail(std::string("unexpected '") + c + "', expected '" + brackets.back() + "'", p);
    brackets.pop_back();
  }
  emit(Token::Op, p, std::string(1, c));
  return p + 1;
}

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace kvant::jinja
