// Python str semantics on UTF-8 for the Jinja interpreter: whitespace,
// strip, split, splitlines, replace, case mapping and code point indexing.
// (Formatting and the bound string methods: jinja_strmethods.cpp.)
#include "tokenizer/jinja_text.h"

#include "tokenizer/utf8.h"

namespace kvant::jinja {

bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

uint32_t code_point_at(std::string_view s, size_t i, size_t& len) {
  len = utf8::valid_sequence_length(s, i);
  if (len == 0) {
    len = 1;
    return uint8_t(s[i]);
  }
  size_t j = i;
  return utf8::next_code_point(s, j);
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    const uint8_t b = uint8_t(s[i]);
    if (b < 0x80) {
      if (!py_space(b)) break;
      ++i;
      continue;
    }
    size_t len;
    if (!py_space(code_point_at(s, i, len))) break;
    i += len;
  }
  return i;
}

namespace {

// Start of the code point that ends right before byte e.
size_t prev_start(std::string_view s, size_t e) {
  size_t k = e - 1;
  while (k > 0 && (uint8_t(s[k]) & 0xC0) == 0x80 && e - k < 4) --k;
  return k;
}

template <class Pred>
std::string_view strip_if(std::string_view s, bool left, bool right, Pred in_set) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t len;
      if (!in_set(code_point_at(s, b, len))) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      const size_t k = prev_start(s, e);
      size_t len;
      const uint32_t c = code_point_at(s, k, len);
      if (k + len != e || !in_set(c)) break;
      e = k;
    }
  }
  return s.substr(b, e - b);
}

}  // namespace

std::string_view py_strip(std::string_view s, bool left, bool right) {
  return strip_if(s, left, right, py_space);
}

std::string_view py_strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  std::vector<uint32_t> set;
  for (size_t i = 0; i < chars.size();) {
    size_t len;
    set.push_back(code_point_at(chars, i, len));
    i += len;
  }
  return strip_if(s, left, right, [&](uint32_t c) {
    for (uint32_t x : set)
      if (x == c) return true;
    return false;
  });
}

bool is_all_space(std::string_view s) { return skip_space(s, 0) == s.size(); }

// ---- case mapping ----

namespace {

uint32_t lower_cp(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
      c != 0x17F) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper ? (c & 1) : !(c & 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

uint32_t upper_cp(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x138 && c != 0x149) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper ? !(c & 1) : (c & 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

void append_lower(uint32_t c, std::string& out) {
  if (c == 0x130) {  // İ lowers to i + combining dot above
    out += 'i';
    utf8::append_code_point(0x307, out);
    return;
  }
  utf8::append_code_point(lower_cp(c), out);
}

void append_upper(uint32_t c, std::string& out, bool title = false) {
  if (c == 0xDF) {  // ß
    out += title ? "Ss" : "SS";
    return;
  }
  utf8::append_code_point(upper_cp(c), out);
}

bool cased(uint32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xDF; }

template <class F>
void each_cp(std::string_view s, F f) {
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const uint32_t c = code_point_at(s, i, len);
    f(c, s.substr(i, len));
    i += len;
  }
}

}  // namespace

std::string py_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  each_cp(s, [&](uint32_t c, std::string_view) { append_lower(c, out); });
  return out;
}

std::string py_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  each_cp(s, [&](uint32_t c, std::string_view) { append_upper(c, out); });
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  each_cp(s, [&](uint32_t c, std::string_view) {
    if (prev_cased)
      append_lower(c, out);
    else
      append_upper(c, out, true);
    prev_cased = cased(c);
  });
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  each_cp(s, [&](uint32_t c, std::string_view) {
    if (first)
      append_upper(c, out, true);
    else
      append_lower(c, out);
    first = false;
  });
  return out;
}

// jinja2's title filter: words start after runs of - whitespace ( { [ <.
std::string jinja_title(std::string_view s) {
  std::string out;
  bool word_start = true;
  each_cp(s, [&](uint32_t c, std::string_view) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
    if (sep) {
      utf8::append_code_point(c, out);
      word_start = true;
    } else if (word_start) {
      append_upper(c, out);
      word_start = false;
    } else {
      append_lower(c, out);
    }
  });
  return out;
}

size_t cp_length(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((uint8_t(c) & 0xC0) != 0x80) ++n;
  return n;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  each_cp(s, [&](uint32_t, std::string_view piece) { out.push_back(piece); });
  return out;
}

// ---- split, splitlines, replace ----

std::vector<std::string> py_split(std::string_view s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    size_t i = skip_space(s, 0);
    while (i < s.size()) {
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.emplace_back(py_strip(s.substr(i), false, true));
        return out;
      }
      size_t j = i;
      while (j < s.size()) {
        size_t len;
        if (py_space(code_point_at(s, j, len))) break;
        j += len;
      }
      out.emplace_back(s.substr(i, j - i));
      i = skip_space(s, j);
    }
    return out;
  }
  if (!sep.is_string()) raise("must be str or None, not " + std::string(sep.type_name()));
  const std::string& d = sep.str();
  if (d.empty()) raise("empty separator");
  size_t i = 0;
  for (;;) {
    const size_t j = s.find(d, i);
    if (j == std::string_view::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
    out.emplace_back(s.substr(i, j - i));
    i = j + d.size();
  }
  out.emplace_back(s.substr(i));
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const Value& sep, int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep.is_none() || sep.is_undefined()) {
    std::string_view rest = py_strip(s, false, true);
    while (!rest.empty()) {
      if (int64_t(out.size()) == maxsplit) {
        out.emplace_back(rest);
        break;
      }
      size_t j = rest.size();
      while (j > 0) {
        const size_t k = prev_start(rest, j);
        size_t len;
        if (py_space(code_point_at(rest, k, len))) break;
        j = k;
      }
      out.emplace_back(rest.substr(j));
      rest = py_strip(rest.substr(0, j), false, true);
    }
  } else {
    if (!sep.is_string()) raise("must be str or None, not " + std::string(sep.type_name()));
    const std::string& d = sep.str();
    if (d.empty()) raise("empty separator");
    size_t end = s.size();
    while (int64_t(out.size()) < maxsplit) {
      if (end < d.size()) break;
      const size_t j = s.rfind(d, end - d.size());
      if (j == std::string_view::npos) break;
      out.emplace_back(s.substr(j + d.size(), end - j - d.size()));
      end = j;
    }
    out.emplace_back(s.substr(0, end));
  }
  return {out.rbegin(), out.rend()};
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t len;
    const uint32_t c = code_point_at(s, i, len);
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      i += len;
      continue;
    }
    size_t end = i + len;
    if (c == '\r' && end < s.size() && s[end] == '\n') ++end;
    out.emplace_back(s.substr(start, (keepends ? end : i) - start));
    start = i = end;
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {  // inserts repl before every character and at the end
    int64_t n = 0;
    for (std::string_view c : code_points(s)) {
      if (count < 0 || n < count) out += repl, ++n;
      out += c;
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t i = 0;
  int64_t n = 0;
  for (;;) {
    const size_t j = s.find(old, i);
    if (j == std::string_view::npos || (count >= 0 && n == count)) break;
    out.append(s.substr(i, j - i));
    out.append(repl);
    i = j + old.size();
    ++n;
  }
  out.append(s.substr(i));
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace kvant::jinja
