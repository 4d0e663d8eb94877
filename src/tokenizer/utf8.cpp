// UTF-8 validation and lossy repair following the Unicode "maximal subpart"
// practice (as CPython and Rust do), and GPT-2's byte alphabet.
#include "tokenizer/utf8.h"

namespace kvant::utf8 {
namespace {

// Bounds of the second byte for each lead byte; later bytes are 80..BF.
// Returns the sequence length, or 0 for a byte that cannot start one.
int expected_length(uint8_t b, uint8_t& lo, uint8_t& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) {
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
    return 3;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    return 4;
  }
  return 0;
}

// How many bytes from s[i] form a valid (possibly incomplete) prefix of a
// sequence of length `need`; stops at the first byte that breaks it.
size_t valid_prefix(std::string_view s, size_t i, int need, uint8_t lo, uint8_t hi) {
  size_t k = 1;
  while (k < size_t(need) && i + k < s.size()) {
    const uint8_t c = uint8_t(s[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
    ++k;
  }
  return k;
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t i) {
  uint8_t lo, hi;
  const int need = expected_length(uint8_t(s[i]), lo, hi);
  if (need == 0) return 0;
  return valid_prefix(s, i, need, lo, hi) == size_t(need) ? size_t(need) : 0;
}

bool is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t append_lossy(std::string_view s, std::string& out, bool final) {
  size_t i = 0, run = 0;  // [run, i) is a stretch of valid bytes not yet copied
  auto flush = [&] { out.append(s.substr(run, i - run)); };
  while (i < s.size()) {
    const uint8_t b = uint8_t(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    uint8_t lo, hi;
    const int need = expected_length(b, lo, hi);
    if (need == 0) {
      flush();
      out.append(kReplacement);
      run = ++i;
      continue;
    }
    const size_t k = valid_prefix(s, i, need, lo, hi);
    if (k == size_t(need)) {
      i += k;
      continue;
    }
    if (i + k == s.size() && !final) {  // incomplete at the end: wait for more
      flush();
      return i;
    }
    flush();
    out.append(kReplacement);
    i += k;
    run = i;
  }
  flush();
  return s.size();
}

void append_code_point(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const uint8_t b = uint8_t(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += size_t(n);
  return cp;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // every code point in the alphabet is < 324
  ByteAlphabet() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? uint32_t(b) : next++;
      to_byte[to_char[b]] = int16_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

uint32_t byte_char(uint8_t b) { return alphabet().to_char[b]; }

int char_byte(uint32_t cp) { return cp < alphabet().to_byte.size() ? alphabet().to_byte[cp] : -1; }

}  // namespace kvant::utf8
