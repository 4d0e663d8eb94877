// Character sets in UTF-8 and JSON-string spelling, and the regular
// expression compiler of regex.h.
#include "grammar/regex.h"

#include <algorithm>

namespace kvant::grammar {

namespace {

constexpr uint32_t kMaxCode = 0x10FFFF;

int utf8_encode(uint32_t c, uint8_t* out) {
  if (c < 0x80) {
    out[0] = uint8_t(c);
    return 1;
  }
  if (c < 0x800) {
    out[0] = uint8_t(0xC0 | (c >> 6));
    out[1] = uint8_t(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = uint8_t(0xE0 | (c >> 12));
    out[1] = uint8_t(0x80 | ((c >> 6) & 0x3F));
    out[2] = uint8_t(0x80 | (c & 0x3F));
    return 3;
  }
  out[0] = uint8_t(0xF0 | (c >> 18));
  out[1] = uint8_t(0x80 | ((c >> 12) & 0x3F));
  out[2] = uint8_t(0x80 | ((c >> 6) & 0x3F));
  out[3] = uint8_t(0x80 | (c & 0x3F));
  return 4;
}

// Byte-range sequences whose union is the UTF-8 of [lo, hi] (one encoded
// length, no surrogates). The range is split until, for every position but
// the last, the bytes of lo and hi differ only where all continuations are
// covered; then one sequence of per-position ranges is exact.
void utf8_ranges(uint32_t lo, uint32_t hi, std::vector<Expr>& out) {
  static const uint32_t kLenEnd[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t b : kLenEnd) {
    if (lo <= b && hi > b) {
      utf8_ranges(lo, b, out);
      utf8_ranges(b + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back(Expr::byte_range(uint8_t(lo), uint8_t(hi)));
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_ranges(lo, lo | m, out);
      utf8_ranges((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_ranges(lo, (hi & ~m) - 1, out);
      utf8_ranges(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  const int n = utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<Expr> seq;
  for (int k = 0; k < n; ++k) seq.push_back(Expr::byte_range(a[k], b[k]));
  out.push_back(Expr::seq(std::move(seq)));
}

// "\u00XX" for a control character, either case of hex letters.
Expr json_control_escape(uint32_t c) {
  static const char* kHex = "0123456789abcdef";
  auto digit = [](char d) {
    ByteSet s = ByteSet::of(uint8_t(d));
    if (d >= 'a' && d <= 'f') s.add(uint8_t(d - 'a' + 'A'));
    return Expr::bytes(s);
  };
  std::vector<Expr> alts;
  alts.push_back(Expr::seq({Expr::lit("\\u00"), digit(kHex[c >> 4]), digit(kHex[c & 15])}));
  const char* shortf = nullptr;
  switch (c) {
    case '\b': shortf = "\\b"; break;
    case '\f': shortf = "\\f"; break;
    case '\n': shortf = "\\n"; break;
    case '\r': shortf = "\\r"; break;
    case '\t': shortf = "\\t"; break;
    default: break;
  }
  if (shortf) alts.push_back(Expr::lit(shortf));
  return Expr::alt(std::move(alts));
}

}  // namespace

CharSet CharSet::range(uint32_t lo, uint32_t hi) {
  CharSet s;
  s.add(lo, hi);
  return s;
}

CharSet CharSet::any() {
  CharSet s;
  s.add(0, 0xD7FF);
  s.add(0xE000, kMaxCode);
  return s;
}

void CharSet::add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  hi = std::min(hi, kMaxCode);
  ranges.push_back({lo, hi});
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  ranges.swap(merged);
}

void CharSet::add(const CharSet& o) {
  for (const auto& r : o.ranges) add(r.first, r.second);
}

CharSet CharSet::complement() const {
  CharSet out;
  uint32_t next = 0;
  for (const auto& r : ranges) {
    if (r.first > next) out.add(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCode) out.add(next, kMaxCode);
  // Surrogates are never characters.
  CharSet clean;
  for (const auto& r : out.ranges) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      clean.add(r.first, r.second);
      continue;
    }
    if (r.first < 0xD800) clean.add(r.first, 0xD7FF);
    if (r.second > 0xDFFF) clean.add(0xE000, r.second);
  }
  return clean;
}

bool CharSet::contains(uint32_t c) const {
  for (const auto& r : ranges)
    if (c >= r.first && c <= r.second) return true;
  return false;
}

Result<Expr> charset_expr(const CharSet& set, TextMode mode) {
  std::vector<Expr> alts;
  for (auto [lo, hi] : set.ranges) {
    // Surrogates have no UTF-8 spelling.
    std::vector<std::pair<uint32_t, uint32_t>> parts;
    if (hi < 0xD800 || lo > 0xDFFF) {
      parts.push_back({lo, hi});
    } else {
      if (lo < 0xD800) parts.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) parts.push_back({0xE000, hi});
    }
    for (auto [a, b] : parts) {
      if (mode == TextMode::Raw) {
        utf8_ranges(a, b, alts);
        continue;
      }
      // JSON: controls, '"' and '\' escaped; '/' also as "\/".
      uint32_t c = a;
      while (c <= b) {
        if (c < 0x20) {
          alts.push_back(json_control_escape(c));
          ++c;
          continue;
        }
        if (c == '"' || c == '\\') {
          alts.push_back(Expr::lit(c == '"' ? "\\\"" : "\\\\"));
          ++c;
          continue;
        }
        uint32_t e = b;
        if (c < '"' && e >= '"') e = '"' - 1;
        else if (c < '\\' && e >= '\\') e = '\\' - 1;
        if (c <= '/' && e >= '/') alts.push_back(Expr::lit("\\/"));
        utf8_ranges(c, e, alts);
        if (e == kMaxCode) break;
        c = e + 1;
      }
    }
  }
  if (alts.empty()) return make_error("a character class that matches no character");
  // Merge the one-byte alternatives into one byte set.
  ByteSet single;
  std::vector<Expr> rest;
  for (Expr& x : alts) {
    if (x.op == Expr::Op::Bytes) single |= x.set;
    else rest.push_back(std::move(x));
  }
  if (!single.empty()) rest.insert(rest.begin(), Expr::bytes(single));
  return Expr::alt(std::move(rest));
}

std::string spell(std::string_view text, TextMode mode) {
  if (mode == TextMode::Raw) return std::string(text);
  std::string out;
  static const char* kHex = "0123456789abcdef";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
        } else {
          out.push_back(char(c));
        }
    }
  }
  return out;
}

}  // namespace kvant::grammar
