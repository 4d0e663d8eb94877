// GgufSource on the small valid GGUF of the broken-file corpus (a Q8_0
// [2, 32] and an F32 [8] tensor, tools/fixtures/gen_broken.py), opened from
// disk and parsed from memory.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "io/gguf_source.h"

namespace kvant {
namespace {

const std::string kValid = std::string(KVANT_FIXTURES) + "/io/valid.gguf";

void check_source(const TensorSource& s) {
  ASSERT_EQ(s.tensors().size(), 2u);
  const TensorRef* a = s.find("a");
  const TensorRef* b = s.find("b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(a->dtype, DType::Q8_0);
  EXPECT_EQ(b->shape, std::vector<int64_t>{8});
  std::vector<float> va(64), vb(8);
  ASSERT_TRUE(s.read_f32(*a, va).ok());
  ASSERT_TRUE(s.read_f32(*b, vb).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(va[size_t(i)], 0.5f * float(i % 32)) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(vb[size_t(i)], float(i));
  std::vector<float> row(32);
  ASSERT_TRUE(s.read_f32_rows(*a, 1, 2, row).ok());
  EXPECT_EQ(row[31], 15.5f);
  auto bad = s.read_f32_rows(*a, 1, 3, row);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("tensor a"), std::string::npos) << bad.error().message;
}

TEST(GgufSource, OpensFromDisk) {
  auto s = open_tensor_source(kValid);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ((*s)->path(), kValid);
  check_source(**s);
}

TEST(GgufSource, ParsesFromMemory) {
  std::ifstream f(kValid, std::ios::binary);
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  auto g = GgufFile::parse(bytes, "mem.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto s = make_gguf_source(std::move(*g));
  EXPECT_EQ(s->path(), "mem.gguf");
  check_source(*s);
}

}  // namespace
}  // namespace kvant
