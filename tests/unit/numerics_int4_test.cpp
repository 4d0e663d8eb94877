// INT4 packing: the compressed-tensors pack-quantized word layout checked
// against a fixture written by tools/fixtures/gen_numerics.py, explicit bit
// patterns, round trips over every length up to a few words, row padding,
// the byte layout, and the length/range contracts (which abort).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "numerics/int4.h"
#include "numerics_fixtures.h"

namespace kvant {
namespace {

using testing::load_numerics_fixture;

TEST(Int4Words, KnownBitPattern) {
  // q = -8..-1 are stored as nibbles 0..7; element i sits at bits [4i, 4i+4).
  const std::vector<int8_t> q = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int32_t> w(2);
  pack_int4_words(q, w);
  EXPECT_EQ(uint32_t(w[0]), 0x76543210u);
  EXPECT_EQ(uint32_t(w[1]), 0xfedcba98u);  // sign bit of the int32 set by element 15
  for (size_t i = 0; i < q.size(); ++i) EXPECT_EQ(int4_get(w.data(), i), q[i]) << i;
}

TEST(Int4Words, PartialWordIsPaddedWithZeroNibbles) {
  const std::vector<int8_t> q = {7, 7, 7};
  std::vector<int32_t> w(1, -1);  // pre-filled, to prove every bit is written
  pack_int4_words(q, w);
  EXPECT_EQ(uint32_t(w[0]), 0x00000fffu);
  std::vector<int8_t> back(3);
  unpack_int4_words(w, back);
  EXPECT_EQ(back, q);
}

TEST(Int4Words, RoundTripEveryLength) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> val(kInt4Min, kInt4Max);
  for (size_t n = 0; n <= 41; ++n) {
    std::vector<int8_t> q(n);
    for (auto& v : q) v = int8_t(val(rng));
    std::vector<int32_t> w(int4_words_for(n));
    pack_int4_words(q, w);
    std::vector<int8_t> back(n, 99);
    unpack_int4_words(w, back);
    EXPECT_EQ(back, q) << "n=" << n;
  }
}

TEST(Int4Words, MatchesPackQuantizedFixture) {
  constexpr size_t kRows = 5, kCols = 37;
  const auto q = load_numerics_fixture<int8_t>("int4_q_5x37.i8");
  const auto want = load_numerics_fixture<int32_t>("int4_packed_5x5.i32");
  ASSERT_EQ(q.size(), kRows * kCols);
  ASSERT_EQ(want.size(), kRows * int4_words_for(kCols));
  std::vector<int32_t> w(want.size());
  pack_int4_rows(q, kRows, kCols, w);
  EXPECT_EQ(w, want);
  std::vector<int8_t> back(q.size());
  unpack_int4_rows(want, kRows, kCols, back);
  EXPECT_EQ(back, q);
}

TEST(Int4Words, Sizes) {
  EXPECT_EQ(int4_words_for(0), 0u);
  EXPECT_EQ(int4_words_for(1), 1u);
  EXPECT_EQ(int4_words_for(8), 1u);
  EXPECT_EQ(int4_words_for(9), 2u);
  EXPECT_EQ(u4_bytes_for(0), 0u);
  EXPECT_EQ(u4_bytes_for(3), 2u);
  EXPECT_EQ(u4_bytes_for(4), 2u);
}

TEST(Int4Bytes, LowNibbleFirst) {
  const std::vector<uint8_t> v = {0x1, 0x2, 0xf, 0x0, 0x9};
  std::vector<uint8_t> b(u4_bytes_for(v.size()), 0xff);
  pack_u4_bytes(v, b);
  EXPECT_EQ(b, (std::vector<uint8_t>{0x21, 0x0f, 0x09}));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(u4_get(b.data(), i), v[i]) << i;
  std::vector<uint8_t> back(v.size());
  unpack_u4_bytes(b, back);
  EXPECT_EQ(back, v);
}

TEST(Int4Bytes, RoundTripAllPairs) {
  std::vector<uint8_t> v;
  for (unsigned hi = 0; hi < 16; ++hi)
    for (unsigned lo = 0; lo < 16; ++lo) v.insert(v.end(), {uint8_t(lo), uint8_t(hi)});
  std::vector<uint8_t> b(u4_bytes_for(v.size()));
  pack_u4_bytes(v, b);
  for (unsigned i = 0; i < 256; ++i) EXPECT_EQ(b[i], i);  // (lo, hi) packs to byte hi*16 + lo
  std::vector<uint8_t> back(v.size());
  unpack_u4_bytes(b, back);
  EXPECT_EQ(back, v);
}

TEST(Int4DeathTest, ContractsAreChecked) {
  std::vector<int8_t> q(9, 0);
  std::vector<int32_t> one(1), two(2);
  EXPECT_DEATH(pack_int4_words(q, one), "check failed");
  EXPECT_DEATH(unpack_int4_words(one, q), "check failed");
  q[3] = 8;
  EXPECT_DEATH(pack_int4_words(q, two), "check failed");
  q[3] = -9;
  EXPECT_DEATH(pack_int4_words(q, two), "check failed");
  std::vector<uint8_t> v = {16};
  std::vector<uint8_t> b(1);
  EXPECT_DEATH(pack_u4_bytes(v, b), "check failed");
}

}  // namespace
}  // namespace kvant
