// FP8 e4m3 weights kept in FP8 (fixtures: tools/fixtures/gen_fp8.py).
//  - DeepSeek-V3 style checkpoint (quant_method "fp8", 128x128
//    weight_scale_inv blocks; MLA, dense and routed experts, shared expert):
//    loads natively as FP8 and gives transformers' logits over the same
//    dequantized weights, through prefill and through the decode path.
//  - compressed-tensors float-quantized checkpoints written by that library
//    (per-channel scales: llama3; 128x128 blocks: qwen3) load as FP8 and
//    give transformers' logits over the fake-quantized weights.
//  - kvant quantize --format fp8 writes a checkpoint that transformers loads
//    through compressed-tensors; kvant's logits from it match transformers'.
//  - --prefill-weights / --decode-weights fp8 on a BF16 checkpoint quantize
//    at load (block amax scales) and stay close to the BF16 logits.
// Tolerance: the FP8 products use exactly the reference's weights, so the
// difference is kvant's BF16 activations (as in the golden tests: 5% of the
// logit spread against the FP32 reference). MLA's kv_b (prefill's K/V
// expansion and the absorbed per-head matrices of decode) stays BF16: the
// dequantized FP8 values rounded to BF16, which the BF16-activation recipe
// does not do, so that comparison gets 5% too (observed 3.3-3.7%; 1.9% for
// the BF16 golden model).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/model.h"
#include "model_test_util.h"
#include "quant/checkpoint.h"

namespace kvant {
namespace {

namespace fs = std::filesystem;

using test::read_f32;

// max |got - ref| as a fraction of the reference logits' standard deviation.
double rel_max_diff(const std::vector<float>& got, const std::vector<float>& ref) {
  double mean = 0, var = 0, maxd = 0;
  for (float x : ref) mean += x;
  mean /= double(ref.size());
  for (float x : ref) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / double(ref.size()));
  for (size_t i = 0; i < ref.size(); ++i) maxd = std::max(maxd, std::fabs(double(got[i]) - ref[i]));
  return maxd / sd;
}

const std::string kFp8 = std::string(KVANT_FIXTURES) + "/fp8/";

std::unique_ptr<Model> load(const std::string& dir, WeightPrecision p) {
  auto m = Model::load(dir, {p, p});
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(Fp8Weights, DeepSeekBlockScaledCheckpointKeepsFp8AndMatchesTransformers) {
  const std::string dir = kFp8 + "deepseek_v3";
  auto m = load(dir, WeightPrecision::kNative);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->set_precision(0), "fp8");
  const auto ids = test::golden_ids("deepseek_v3");
  const int64_t V = m->config().vocab;
  const auto ref = read_f32(dir + "/logits.f32", ids.size() * size_t(V));
  const auto ref16 = read_f32(dir + "/logits_bf16act.f32", ids.size() * size_t(V));
  for (int64_t chunk : {int64_t(ids.size()), int64_t(1)}) {
    const auto got = test::run_chunked(*m, ids, chunk);
    const double rel = rel_max_diff(got, ref), rel16 = rel_max_diff(got, ref16);
    std::printf("fp8 deepseek_v3 (chunk %lld): max |diff| %.4f of the spread (FP32 ref), %.4f "
                "(BF16-activation ref), mean KL %.2e\n",
                (long long)chunk, rel, rel16, test::mean_kl(ref, got, V));
    EXPECT_LT(rel, 0.05);
    EXPECT_LT(rel16, 0.05);
  }
  // Every routed expert, the shared expert and the MLA projections hold
  // FP8; the router and the expansion kept for prefill stay BF16.
  int fp8 = 0, bf16 = 0;
  for_each_linear(m->weight_set(0), [&](const LinearInfo& i) {
    if (i.head) return;
    if (i.q && !i.q->f8.empty())
      ++fp8;
    else if (i.q)
      ++bf16;
  });
  EXPECT_GT(fp8, 0);
  EXPECT_EQ(bf16, 0);
}

TEST(Fp8Weights, BlockScaledCheckpointAsBf16GivesTheSameModel) {
  // The same checkpoint widened to BF16 at load: the BF16 kernels on
  // bf16(code * scale) against the FP8 kernels on code and scale.
  const std::string dir = kFp8 + "deepseek_v3";
  auto a = load(dir, WeightPrecision::kFp8), b = load(dir, WeightPrecision::kBf16);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->set_precision(0), "bf16");
  EXPECT_LT(weights_bytes(a->weight_set(0)), weights_bytes(b->weight_set(0)));
  const auto ids = test::golden_ids("deepseek_v3");
  const auto ga = test::run_chunked(*a, ids, int64_t(ids.size()));
  const auto gb = test::run_chunked(*b, ids, int64_t(ids.size()));
  const double rel = rel_max_diff(ga, gb);
  std::printf("deepseek_v3 fp8 vs the same weights rounded to BF16: max |diff| %.4f\n", rel);
  EXPECT_LT(rel, 0.05);
}

class Fp8CompressedTensors : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8CompressedTensors, LibraryCheckpointMatchesTransformers) {
  const std::string dir = kFp8 + "ct_" + GetParam();
  auto m = load(dir, WeightPrecision::kNative);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->set_precision(0), "fp8");
  const auto ids = test::golden_ids(GetParam());
  const int64_t V = m->config().vocab;
  const auto ref = read_f32(dir + "/logits.f32", ids.size() * size_t(V));
  const auto got = test::run_chunked(*m, ids, int64_t(ids.size()));
  const double rel = rel_max_diff(got, ref), kl = test::mean_kl(ref, got, V);
  std::printf("%s: max |diff| %.4f of the spread, mean KL %.2e\n", dir.c_str(), rel, kl);
  EXPECT_LT(rel, 0.06);
  EXPECT_LT(kl, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Golden, Fp8CompressedTensors, ::testing::Values("llama3", "qwen3"));

TEST(Fp8Weights, KvantCheckpointMatchesTransformers) {
  QuantizeOptions o;
  o.in = std::string(KVANT_FIXTURES) + "/golden/llama3";
  o.out = (fs::temp_directory_path() / ("kvant_fp8_" + std::to_string(::getpid()))).string();
  o.format = QuantFormat::kFp8;
  auto q = quantize_checkpoint(o);
  ASSERT_TRUE(q.ok()) << q.error().message;
  {
    auto m = load(o.out, WeightPrecision::kNative);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->set_precision(0), "fp8");
    const auto ids = test::golden_ids("llama3");
    const int64_t V = m->config().vocab;
    const auto ref = read_f32(kFp8 + "kvant_llama3_logits.f32", ids.size() * size_t(V));
    const auto got = test::run_chunked(*m, ids, int64_t(ids.size()));
    const double rel = rel_max_diff(got, ref), kl = test::mean_kl(ref, got, V);
    std::printf("kvant quantize --format fp8 -> transformers: max |diff| %.4f, mean KL %.2e\n", rel, kl);
    EXPECT_LT(rel, 0.06);
    EXPECT_LT(kl, 1e-4);
  }
  fs::remove_all(o.out);
}

TEST(Fp8Weights, QuantizedAtLoadStaysCloseToBf16) {
  const std::string dir = std::string(KVANT_FIXTURES) + "/golden/qwen3";
  auto f = load(dir, WeightPrecision::kFp8), b = load(dir, WeightPrecision::kBf16);
  ASSERT_TRUE(f && b);
  EXPECT_EQ(f->set_precision(0), "fp8");
  const auto ids = test::golden_ids("qwen3");
  const int64_t V = f->config().vocab;
  const auto gf = test::run_chunked(*f, ids, int64_t(ids.size()));
  const auto gb = test::run_chunked(*b, ids, int64_t(ids.size()));
  const double kl = test::mean_kl(gb, gf, V);
  std::printf("qwen3 fp8 at load vs bf16: max |diff| %.4f of the spread, mean KL %.2e\n",
              rel_max_diff(gf, gb), kl);
  EXPECT_LT(kl, 4e-3);
}

}  // namespace
}  // namespace kvant
