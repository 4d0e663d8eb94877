// Both real GGUF models through TensorSource: every tensor decodes to
// finite FP32 values of the right count, shapes agree with the GGUF
// directory, and row-range reads agree with whole-tensor reads. The models
// live in KVANT_MODELS (scripts/fetch_model.sh all); without them the test
// is skipped, since unit tests must not need a model.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "io/dequant.h"
#include "io/gguf.h"
#include "io/tensor_source.h"

namespace kvant {
namespace {

class IoModels : public ::testing::TestWithParam<const char*> {};

TEST_P(IoModels, DequantizesEveryTensor) {
  const std::string path = std::string(KVANT_MODELS) + "/" + GetParam();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " not present (scripts/fetch_model.sh all)";
  auto src = open_tensor_source(path);
  ASSERT_TRUE(src.ok()) << src.error().message;
  auto gguf = GgufFile::open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  const auto& tensors = (*src)->tensors();
  ASSERT_EQ(tensors.size(), gguf->tensors().size());
  ASSERT_FALSE(tensors.empty());

  std::map<std::string, int> by_type;
  std::vector<float> buf;
  double seconds = 0;
  int64_t total = 0;
  for (const auto& t : tensors) {
    const GgufTensor* g = gguf->find_tensor(t.name);
    ASSERT_NE(g, nullptr) << t.name;
    EXPECT_EQ(t.shape, g->shape) << t.name;
    EXPECT_EQ(t.dtype, g->dtype) << t.name;
    EXPECT_EQ(t.data.size(), dtype_bytes(t.dtype, uint64_t(t.numel()))) << t.name;
    EXPECT_EQ((*src)->find(t.name), &t);
    ASSERT_TRUE(dequant_supported(t.dtype)) << t.name << " " << dtype_name(t.dtype);
    ++by_type[dtype_name(t.dtype)];
    buf.assign(size_t(t.numel()), NAN);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*src)->read_f32(t, buf);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += t.numel();
    ASSERT_TRUE(r.ok()) << r.error().message;
    int64_t nonfinite = 0;
    for (float v : buf) nonfinite += !std::isfinite(v);
    EXPECT_EQ(nonfinite, 0) << t.name;

    // The last rows read alone equal the same rows of the whole tensor.
    const int64_t rows = TensorSource::num_rows(t), len = TensorSource::row_length(t);
    const int64_t b = rows > 3 ? rows - 3 : 0;
    std::vector<float> part(size_t((rows - b) * len));
    ASSERT_TRUE((*src)->read_f32_rows(t, b, rows, part).ok()) << t.name;
    EXPECT_EQ(std::memcmp(part.data(), buf.data() + b * len, part.size() * 4), 0) << t.name;
  }
  EXPECT_FALSE(
      (*src)->read_f32_rows(tensors[0], 0, TensorSource::num_rows(tensors[0]) + 1, buf).ok());
  std::string types;
  for (const auto& [k, v] : by_type) types += " " + k + "x" + std::to_string(v);
  std::printf("%s: %zu tensors,%s; %.1f M values decoded in %.3f s on one thread\n", GetParam(),
              tensors.size(), types.c_str(), double(total) / 1e6, seconds);
}

INSTANTIATE_TEST_SUITE_P(
    Io, IoModels, ::testing::Values("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"),
    [](const auto& info) { return std::string(info.index == 0 ? "SmolLM2" : "Gemma3"); });

}  // namespace
}  // namespace kvant
