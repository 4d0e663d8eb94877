// Scalar INT4 pack/unpack (layouts in int4.h and docs/FORMATS.md). These are
// load/quantize-time routines and the reference for any vectorised unpacking
// in kernels/; they check their contracts because a wrong length here would
// silently shift every later weight of a tensor.
#include "numerics/int4.h"

#include "core/check.h"

namespace kvant {

void pack_int4_words(std::span<const int8_t> q, std::span<int32_t> words) {
  KV_CHECK_EQ(words.size(), int4_words_for(q.size()));
  for (size_t w = 0; w < words.size(); ++w) {
    const size_t begin = w * kInt4PerWord;
    const size_t end = begin + kInt4PerWord < q.size() ? begin + kInt4PerWord : q.size();
    uint32_t bits = 0;  // unsigned: shifting a nibble into bit 31 must not be UB
    for (size_t i = begin; i < end; ++i) {
      const int v = q[i];
      KV_CHECK_GE(v, kInt4Min);
      KV_CHECK_LE(v, kInt4Max);
      bits |= uint32_t(v + kInt4Offset) << (4 * (i - begin));
    }
    words[w] = int32_t(bits);
  }
}

void unpack_int4_words(std::span<const int32_t> words, std::span<int8_t> q) {
  KV_CHECK_EQ(words.size(), int4_words_for(q.size()));
  for (size_t i = 0; i < q.size(); ++i) q[i] = int8_t(int4_get(words.data(), i));
}

void pack_int4_rows(std::span<const int8_t> q, size_t rows, size_t cols, std::span<int32_t> words) {
  const size_t wpr = int4_words_for(cols);
  KV_CHECK_EQ(q.size(), rows * cols);
  KV_CHECK_EQ(words.size(), rows * wpr);
  for (size_t r = 0; r < rows; ++r)
    pack_int4_words(q.subspan(r * cols, cols), words.subspan(r * wpr, wpr));
}

void unpack_int4_rows(std::span<const int32_t> words, size_t rows, size_t cols,
                      std::span<int8_t> q) {
  const size_t wpr = int4_words_for(cols);
  KV_CHECK_EQ(q.size(), rows * cols);
  KV_CHECK_EQ(words.size(), rows * wpr);
  for (size_t r = 0; r < rows; ++r)
    unpack_int4_words(words.subspan(r * wpr, wpr), q.subspan(r * cols, cols));
}

void pack_u4_bytes(std::span<const uint8_t> v, std::span<uint8_t> bytes) {
  KV_CHECK_EQ(bytes.size(), u4_bytes_for(v.size()));
  for (size_t b = 0; b < bytes.size(); ++b) {
    const unsigned lo = v[2 * b];
    const unsigned hi = 2 * b + 1 < v.size() ? v[2 * b + 1] : 0u;
    KV_CHECK_LE(lo, 15u);
    KV_CHECK_LE(hi, 15u);
    bytes[b] = uint8_t(lo | (hi << 4));
  }
}

void unpack_u4_bytes(std::span<const uint8_t> bytes, std::span<uint8_t> v) {
  KV_CHECK_EQ(bytes.size(), u4_bytes_for(v.size()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint8_t(u4_get(bytes.data(), i));
}

}  // namespace kvant
