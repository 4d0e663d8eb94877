// Dequantization against an independent implementation: fixtures written by
// tools/fixtures/gen_dequant.py from gguf-py (ggml types), ml_dtypes (FP8)
// and numpy (F16/F32). Every value must match bit for bit; NaN matches NaN.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "io/dequant.h"
#include "io/dtype.h"

namespace kvant {
namespace {

const std::string kDir = std::string(KVANT_FIXTURES) + "/io/dequant/";

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::vector<float> read_f32s(const std::string& path) {
  auto b = read_all(path);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

DType by_name(const std::string& n) {
  for (int i = 0; i < int(DType::Unknown); ++i)
    if (n == dtype_name(DType(i))) return DType(i);
  return DType::Unknown;
}

class DequantFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(DequantFixture, MatchesReferenceBitExactly) {
  const std::string name = GetParam();
  const DType t = by_name(name);
  ASSERT_NE(t, DType::Unknown) << name;
  const auto src = read_all(kDir + name + ".bin");
  const auto want = read_f32s(kDir + name + ".f32");
  ASSERT_FALSE(want.empty());
  std::vector<float> got(want.size(), -12345.f);
  auto r = dequantize(t, src, got, name);
  ASSERT_TRUE(r.ok()) << r.error().message;
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = std::isnan(want[i])
                          ? std::isnan(got[i])
                          : std::bit_cast<uint32_t>(want[i]) == std::bit_cast<uint32_t>(got[i]);
    if (!same && ++bad <= 5)
      ADD_FAILURE() << name << " element " << i << ": got " << got[i] << " want " << want[i];
  }
  EXPECT_EQ(bad, 0) << name;

  // Decoding in two block-aligned halves gives the same values.
  const int64_t be = dtype_info(t).block_elems, n = int64_t(want.size());
  const int64_t mid = (n / be / 2) * be;
  std::vector<float> parts(want.size());
  ASSERT_TRUE(dequantize_range(t, src, 0, mid, std::span(parts).first(size_t(mid)), name).ok());
  ASSERT_TRUE(dequantize_range(t, src, mid, n, std::span(parts).subspan(size_t(mid)), name).ok());
  EXPECT_EQ(std::memcmp(parts.data(), got.data(), got.size() * 4), 0) << name;
}

INSTANTIATE_TEST_SUITE_P(Dequant, DequantFixture,
                         ::testing::Values("F32", "F16", "BF16", "F8_E4M3", "Q4_0", "Q4_1", "Q5_0",
                                           "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Dequant, RejectsWrongSizesAndTypes) {
  std::vector<uint8_t> src(34);
  std::vector<float> out(32);
  EXPECT_TRUE(dequantize(DType::Q8_0, src, out, "t").ok());
  auto r = dequantize(DType::Q8_0, std::span(src).first(33), out, "file.gguf: tensor x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("file.gguf: tensor x"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("34 bytes"), std::string::npos) << r.error().message;
  std::vector<float> odd(31);
  EXPECT_FALSE(dequantize(DType::Q8_0, src, odd, "t").ok());
  EXPECT_FALSE(dequantize(DType::Q8_K, src, out, "t").ok());
  EXPECT_FALSE(dequantize(DType::I32, src, out, "t").ok());
  // Ranges must be block aligned and inside the source and the output.
  EXPECT_FALSE(dequantize_range(DType::Q8_0, src, 16, 32, out, "t").ok());
  EXPECT_FALSE(dequantize_range(DType::Q8_0, src, 0, 64, out, "t").ok());
  EXPECT_FALSE(dequantize_range(DType::Q8_0, src, 32, 0, out, "t").ok());
  EXPECT_FALSE(dequantize_range(DType::Q8_0, src, 0, 32, std::span(out).first(8), "t").ok());
  EXPECT_TRUE(dequantize_range(DType::Q8_0, src, 32, 32, {}, "t").ok());
}

TEST(Dequant, SupportedTypes) {
  for (DType t :
       {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::Q4_0, DType::Q4_1, DType::Q5_0,
        DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    EXPECT_TRUE(dequant_supported(t)) << dtype_name(t);
  for (DType t : {DType::F64, DType::I8, DType::F8_E5M2, DType::Q8_K, DType::Unknown})
    EXPECT_FALSE(dequant_supported(t)) << dtype_name(t);
}

}  // namespace
}  // namespace kvant
