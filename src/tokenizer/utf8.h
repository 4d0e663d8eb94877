// UTF-8 helpers for the tokenizer: code point iteration, lossy repair of
// invalid byte sequences (one U+FFFD per maximal invalid subpart, the rule
// Python's and Rust's lossy decoders use, so decode() and the stream decoder
// agree byte for byte), and the GPT-2 byte <-> character alphabet of
// byte-level BPE. It does not normalize (no NFC/NFKC) and knows no vocabulary.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvant::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";    // U+2581 '▁'

// Length of the well-formed sequence starting at s[i], or 0 when it is
// invalid or truncated.
size_t valid_sequence_length(std::string_view s, size_t i);

bool is_valid(std::string_view s);

// Appends `bytes` to `out` with invalid sequences replaced by U+FFFD. When
// `final` is false an incomplete sequence at the very end is held back: the
// return value is the number of bytes consumed (the rest must be passed again
// with more bytes appended). With `final` true everything is consumed.
size_t append_lossy(std::string_view bytes, std::string& out, bool final);

inline std::string to_valid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_lossy(bytes, out, true);
  return out;
}

// Appends the UTF-8 encoding of code point `cp`.
void append_code_point(uint32_t cp, std::string& out);

// Decodes the code point of the (valid) sequence at s[i]; advances i.
uint32_t next_code_point(std::string_view s, size_t& i);

size_t count_code_points(std::string_view s);

// GPT-2's byte-level alphabet: byte b is spelled as the UTF-8 of code point
// byte_char(b); printable Latin-1 bytes map to themselves, the rest to 256+.
uint32_t byte_char(uint8_t b);
// The byte a code point spells, or -1 when it is not in the alphabet.
int char_byte(uint32_t cp);

}  // namespace kvant::utf8
