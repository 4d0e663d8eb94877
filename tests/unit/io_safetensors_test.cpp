// safetensors: fixtures written by the `safetensors` package (torch) with
// FP32 references from numpy + ml_dtypes (tools/fixtures/gen_safetensors.py),
// including FP8 weights with 128x128 block scales; plus in-memory images
// for header rules the fixtures do not cover.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/tensor_source.h"

namespace kvant {
namespace {

const std::string kSt = std::string(KVANT_FIXTURES) + "/io/st/";

std::vector<float> read_f32s(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> b{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) b[8 + header.size() + i] = uint8_t(i);
  return b;
}

TEST(Safetensors, SingleFileMatchesNumpyReference) {
  auto src = open_tensor_source(kSt + "single");
  ASSERT_TRUE(src.ok()) << src.error().message;
  const auto& ts = (*src)->tensors();
  ASSERT_EQ(ts.size(), 8u);
  const TensorRef* a = (*src)->find("fp8_a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F8_E4M3);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{130, 136}));
  EXPECT_EQ((*src)->find("fp8_b_scale_inv")->dtype, DType::BF16);
  EXPECT_EQ((*src)->find("f16")->shape, std::vector<int64_t>{7});
  EXPECT_EQ((*src)->find("nope"), nullptr);

  const auto want = read_f32s(kSt + "single/expected.f32");
  std::vector<std::string> names;
  for (const auto& t : ts) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  size_t at = 0;
  for (const auto& n : names) {
    const TensorRef* t = (*src)->find(n);
    std::vector<float> got(size_t(t->numel()));
    auto r = (*src)->read_f32(*t, got);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_LE(at + got.size(), want.size());
    EXPECT_TRUE(same_bits(got, std::span(want).subspan(at, got.size()))) << n;
    at += got.size();
  }
  EXPECT_EQ(at, want.size());
}

TEST(Safetensors, BlockScaledRowRangesCrossBlockAndBatchEdges) {
  auto src = open_tensor_source(kSt + "single/model.safetensors");
  ASSERT_TRUE(src.ok()) << src.error().message;
  for (const char* name : {"fp8_a", "fp8_b"}) {
    const TensorRef* t = (*src)->find(name);
    std::vector<float> all(size_t(t->numel()));
    ASSERT_TRUE((*src)->read_f32(*t, all).ok());
    const int64_t len = TensorSource::row_length(*t);
    // Rows 126..130 straddle a 128-row scale block and, for fp8_b [2, 129, 20], a batch edge.
    const int64_t end = std::min<int64_t>(131, TensorSource::num_rows(*t));
    std::vector<float> part(size_t((end - 126) * len));
    auto r = (*src)->read_f32_rows(*t, 126, end, part);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_TRUE(same_bits(part, std::span(all).subspan(size_t(126 * len), part.size()))) << name;
  }
  const TensorRef* a = (*src)->find("fp8_a");
  std::vector<float> small(10);
  auto r = (*src)->read_f32_rows(*a, 0, 1, small);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("fp8_a"), std::string::npos) << r.error().message;
  TensorRef foreign{"not_here", {1}, DType::F32, {}};
  EXPECT_FALSE((*src)->read_f32(foreign, small).ok());
}

TEST(Safetensors, MetadataAndFileOrder) {
  auto f = SafetensorsFile::open(kSt + "single/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->tensors().size(), 8u);
  for (size_t i = 1; i < f->tensors().size(); ++i)
    EXPECT_LE(f->tensors()[i - 1].offset + f->tensors()[i - 1].nbytes, f->tensors()[i].offset);
  EXPECT_EQ(f->find("f32")->nbytes, 16u);
}

TEST(Safetensors, ShardedByDirectoryAndByIndex) {
  for (const std::string& p : {kSt + "sharded", kSt + "sharded/model.safetensors.index.json"}) {
    auto src = open_tensor_source(p);
    ASSERT_TRUE(src.ok()) << src.error().message;
    EXPECT_EQ((*src)->tensors().size(), 3u);
    const TensorRef* w = (*src)->find("layer0.weight");
    ASSERT_NE(w, nullptr);
    std::vector<float> v(6);
    ASSERT_TRUE((*src)->read_f32(*w, v).ok());
    EXPECT_EQ(v, (std::vector<float>{0, 1, 2, 3, 4, 5}));
    std::vector<float> b(2), h(4);
    ASSERT_TRUE((*src)->read_f32(*(*src)->find("layer0.bias"), b).ok());
    EXPECT_EQ(b, (std::vector<float>{0.5f, -0.5f}));
    ASSERT_TRUE((*src)->read_f32(*(*src)->find("layer1.weight"), h).ok());
    EXPECT_EQ(h, (std::vector<float>{1, 2, 3, 4}));
  }
}

TEST(Safetensors, HfConfig) {
  auto c = read_hf_config(kSt + "single");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ((*c)["hidden_size"].get<int>(), 64);
  auto missing = read_hf_config(kSt + "sharded");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("config.json"), std::string::npos);
}

TEST(Safetensors, OpenTensorSourceRejectsUnknownPaths) {
  auto r = open_tensor_source(kSt + "single/config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("unknown model file type"), std::string::npos)
      << r.error().message;
  auto m = open_tensor_source(kSt + "does_not_exist.safetensors");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("does_not_exist"), std::string::npos);
}

TEST(Safetensors, ParseFromBytes) {
  // Padding spaces after the JSON, a zero-size tensor, an empty header.
  auto ok = image(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                  R"("w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}   )",
                  4);
  auto f = SafetensorsFile::parse(ok, "mem");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->data_offset(), 8 + ok.size() - 12);
  auto empty = image("{}", 0);
  EXPECT_TRUE(SafetensorsFile::parse(empty, "mem").ok());

  struct Case {
    std::string header;
    size_t data;
    const char* expect;
  };
  const Case bad[] = {
      {R"({"__metadata__":{"a":"x","a":"y"}})", 0, "duplicate JSON key \"a\""},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "shape"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8, "data_offsets"},
      {R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", 4,
       "too many elements"},
      {R"({"w":[1]})", 0, "not a JSON object"},
      {R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4, "dtype"},
      {R"({"__metadata__":[]})", 0, "__metadata__"},
      {R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]},)"
       R"("v":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})",
       8, "overlap at offset"},
  };
  for (const auto& c : bad) {
    auto img = image(c.header, c.data);
    auto r = SafetensorsFile::parse(img, "mem.safetensors");
    ASSERT_FALSE(r.ok()) << c.header;
    EXPECT_NE(r.error().message.find("mem.safetensors"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
  }
}

TEST(Safetensors, ScalesValidatedWhenSourceIsMade) {
  // FP8 [2, 130] needs scales [1, 2]; a 1-D FP8 weight cannot have block scales.
  auto good = image(R"({"w":{"dtype":"F8_E4M3","shape":[2,130],"data_offsets":[0,260]},)"
                    R"("w_scale_inv":{"dtype":"F32","shape":[1,2],"data_offsets":[260,268]}})",
                    268);
  auto bad = image(R"({"v":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]},)"
                   R"("v_scale_inv":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                   12);
  auto fg = SafetensorsFile::parse(good, "good");
  auto fb = SafetensorsFile::parse(bad, "bad");
  ASSERT_TRUE(fg.ok() && fb.ok());
  std::vector<SafetensorsFile> one;
  one.push_back(std::move(*fg));
  auto s = make_safetensors_source(std::move(one), "good");
  ASSERT_TRUE(s.ok()) << s.error().message;
  std::vector<float> out(260);
  ASSERT_TRUE((*s)->read_f32(*(*s)->find("w"), out).ok());
  std::vector<SafetensorsFile> two;
  two.push_back(std::move(*fb));
  auto e = make_safetensors_source(std::move(two), "bad");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("v_scale_inv"), std::string::npos) << e.error().message;
}

}  // namespace
}  // namespace kvant
