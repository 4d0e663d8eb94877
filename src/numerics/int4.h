// 4-bit integer packing. Two layouts:
//  - int32 words, compressed-tensors "pack-quantized" (kvant's W4A16 weights):
//    a signed value q in [-8, 7] is stored as the unsigned nibble q + 8, eight
//    per little-endian int32, element i of a word at bits [4i, 4i + 4).
//  - bytes: unsigned values 0..15, two per byte, low nibble first.
// A sequence of n values always occupies ceil(n / 8) words or ceil(n / 2)
// bytes; unused trailing nibbles of the last word/byte are written as 0 and
// ignored when reading (compressed-tensors pads each row the same way, so a
// padded signed nibble would read back as -8). Matrices pack row by row, each
// row padded on its own. Layout diagram: docs/FORMATS.md.
//
// Also the logical content of one W4A16 linear (Int4Weight). Owns packing
// and that container: the quantization rules are int4_rtn.h's, dequantizing
// kernels are the kernels'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvant {

inline constexpr size_t kInt4PerWord = 8;  // nibbles in one int32 word
inline constexpr size_t kInt4PerByte = 2;
inline constexpr int kInt4Min = -8;
inline constexpr int kInt4Max = 7;
inline constexpr int kInt4Offset = 8;  // stored nibble = q + kInt4Offset
static_assert(sizeof(int32_t) * 2 == kInt4PerWord, "8 nibbles per 4-byte word");

constexpr size_t int4_words_for(size_t n) { return (n + kInt4PerWord - 1) / kInt4PerWord; }
constexpr size_t u4_bytes_for(size_t n) { return (n + kInt4PerByte - 1) / kInt4PerByte; }

// Element i of a packed word sequence, for kernels that read in place.
inline int int4_get(const int32_t* words, size_t i) {
  const auto w = uint32_t(words[i / kInt4PerWord]);
  return int((w >> (4 * (i % kInt4PerWord))) & 0xfu) - kInt4Offset;
}
inline unsigned u4_get(const uint8_t* bytes, size_t i) {
  return (bytes[i / 2] >> (4 * (i % 2))) & 0xfu;
}

// q: n signed values in [-8, 7]; words.size() must equal int4_words_for(n).
// Both the length and every value are checked (a violation is a bug: abort).
void pack_int4_words(std::span<const int8_t> q, std::span<int32_t> words);
// words.size() must equal int4_words_for(q.size()); fills all of q.
void unpack_int4_words(std::span<const int32_t> words, std::span<int8_t> q);

// Row-major matrix [rows, cols] <-> packed [rows, int4_words_for(cols)].
// q.size() == rows * cols and words.size() == rows * int4_words_for(cols).
void pack_int4_rows(std::span<const int8_t> q, size_t rows, size_t cols, std::span<int32_t> words);
void unpack_int4_rows(std::span<const int32_t> words, size_t rows, size_t cols,
                      std::span<int8_t> q);

// v: n unsigned values in [0, 15]; bytes.size() must equal u4_bytes_for(n).
void pack_u4_bytes(std::span<const uint8_t> v, std::span<uint8_t> bytes);
// bytes.size() must equal u4_bytes_for(v.size()); fills all of v.
void unpack_u4_bytes(std::span<const uint8_t> bytes, std::span<uint8_t> v);

// Logical content of one W4A16 linear layer, whatever the file layout.
struct Int4Weight {
  int64_t rows = 0, cols = 0, group = 0;  // the last group of a row may be short
  std::vector<int8_t> q;                  // [rows, cols], each in [-8, 7]
  std::vector<float> scale;               // [rows, ceil(cols / group)] (BF16-representable values)
  std::vector<int8_t> zero;               // [rows, ceil(cols / group)] in [-8, 7]; empty = symmetric
  // w[r, c] = (q[r, c] - zero[r, c / group]) * scale[r, c / group]
};

}  // namespace kvant
