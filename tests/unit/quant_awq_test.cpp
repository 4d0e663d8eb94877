// Activation-aware INT4: the scale search cuts the output error of a product
// whose inputs have salient channels; the folded scales leave the
// unquantized model's logits unchanged (up to BF16 rounding of the scaled
// tensors) on the tiny golden models, Gemma's (1 + w) norms included; and
// an AWQ INT4 checkpoint loads and stays as close to BF16 as RTN's; and
// `kvant quantize`'s pipeline (quantize_pipeline.h) writes exactly what the
// plan and the checkpoint writer write by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "model/model.h"
#include "model_test_util.h"
#include "quant/awq.h"
#include "quant/awq_plan.h"
#include "quant/checkpoint.h"
#include "quant/quantize_pipeline.h"

namespace kvant {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("kvant_awq_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

TEST(Awq, SearchCutsOutputErrorWithSalientChannels) {
  const int64_t rows = 64, cols = 128, n = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(size_t(rows * cols)), x(size_t(n * cols));
  for (auto& v : w) v = d(rng) * 0.05f;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < cols; ++c)
      x[size_t(i * cols + c)] = d(rng) * (c % 37 == 3 ? 40.f : 1.f);  // four salient channels
  AwqOptions o;
  o.group = 64;
  const AwqResult r = awq_search(w.data(), rows, cols, x.data(), n, o);
  ASSERT_EQ(r.scale.size(), size_t(cols));
  EXPECT_GT(r.alpha, 0.f);
  EXPECT_LT(r.mse_best, 0.8 * r.mse_rtn) << "alpha " << r.alpha;
  // Salient channels get the larger scales.
  EXPECT_GT(r.scale[3], r.scale[4]);
}

std::vector<float> logits(Model& m, const std::vector<int32_t>& ids) {
  return test::run_chunked(m, ids, int64_t(ids.size()));
}
using test::mean_kl;

class AwqModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(AwqModelTest, FoldedScalesKeepTheModelAndQuantizeWell) {
  const std::string in = std::string(KVANT_FIXTURES) + "/golden/" + GetParam();
  auto ref = Model::load(in, {WeightPrecision::kBf16, WeightPrecision::kBf16});
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  const auto& c = (*ref)->config();
  std::mt19937 rng(11);
  std::vector<int32_t> calib(256), ids(48);
  for (auto& t : calib) t = int32_t(rng() % uint32_t(c.vocab));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(c.vocab));
  AwqOptions ao;
  ao.group = 32;
  auto plan = awq_plan(**ref, calib, 64, 128, ao);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->report.size(), size_t(3 * c.layers));
  const auto base = logits(**ref, ids);

  // Folded but not quantized: the same function up to BF16 rounding.
  QuantizeOptions o;
  o.in = in;
  o.out = temp_dir(GetParam() + "_fold");
  o.keep = {".*"};
  o.adjust = [&](const std::string& n, const std::vector<int64_t>& s, std::vector<float>& v) {
    plan->apply(n, s, v);
  };
  ASSERT_TRUE(quantize_checkpoint(o).ok());
  auto folded = Model::load(o.out, {WeightPrecision::kBf16, WeightPrecision::kBf16});
  ASSERT_TRUE(folded.ok()) << folded.error().message;
  const double kl_fold = mean_kl(base, logits(**folded, ids), c.vocab);
  EXPECT_LT(kl_fold, 2e-3) << GetParam();

  // Quantized: AWQ and RTN checkpoints both load as INT4 and stay close.
  o.keep.clear();
  o.group_size = 32;
  o.out = temp_dir(GetParam() + "_awq");
  ASSERT_TRUE(quantize_checkpoint(o).ok());
  QuantizeOptions rtn = o;
  rtn.adjust = {};
  rtn.out = temp_dir(GetParam() + "_rtn");
  ASSERT_TRUE(quantize_checkpoint(rtn).ok());
  auto qa = Model::load(o.out), qr = Model::load(rtn.out);
  ASSERT_TRUE(qa.ok() && qr.ok());
  EXPECT_EQ((*qa)->set_precision(0), "int4");
  const double kl_awq = mean_kl(base, logits(**qa, ids), c.vocab);
  const double kl_rtn = mean_kl(base, logits(**qr, ids), c.vocab);
  std::printf("%s: folded KL %.2e, INT4 g32 KL: rtn %.5f, awq %.5f\n", GetParam().c_str(), kl_fold,
              kl_rtn, kl_awq);
  // Random weights and tokens have no salient channels to protect: AWQ may
  // not win here, but must not lose much.
  EXPECT_LT(kl_awq, 1.5 * kl_rtn + 1e-3) << GetParam();
  for (auto* d : {&o.out, &rtn.out}) fs::remove_all(*d);
  fs::remove_all(temp_dir(GetParam() + "_fold"));
}

INSTANTIATE_TEST_SUITE_P(Archs, AwqModelTest, ::testing::Values("llama3", "qwen3", "gemma3"));

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(QuantizePipeline, WritesWhatThePlanAndTheWriterWrite) {
  const std::string in = std::string(KVANT_FIXTURES) + "/golden/llama3";
  auto ref = Model::load(in, {WeightPrecision::kBf16, WeightPrecision::kBf16});
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  const auto& c = (*ref)->config();
  std::mt19937 rng(3);
  std::vector<int32_t> calib(300);
  for (auto& t : calib) t = int32_t(rng() % uint32_t(c.vocab));
  for (bool awq : {false, true}) {
    QuantizeOptions o;
    o.in = in;
    o.group_size = 32;
    o.out = temp_dir(std::string("by_hand_") + (awq ? "awq" : "rtn"));
    AwqOptions ao;
    ao.group = 32;
    auto plan = awq_plan(**ref, calib, 512, 64, ao);
    ASSERT_TRUE(plan.ok()) << plan.error().message;
    if (awq)
      o.adjust = [&](const std::string& n, const std::vector<int64_t>& s, std::vector<float>& v) {
        plan->apply(n, s, v);
      };
    auto want = quantize_checkpoint(o);
    ASSERT_TRUE(want.ok()) << want.error().message;

    QuantizePipelineOptions p;
    p.checkpoint = o;
    p.checkpoint.adjust = {};
    p.checkpoint.out = temp_dir(std::string("pipeline_") + (awq ? "awq" : "rtn"));
    p.awq = awq;
    p.calib_tokens = calib;
    p.calib_source = "random";
    p.calib_rows = 64;
    std::vector<std::string> log;
    p.log = [&](const std::string& line) { log.push_back(line); };
    auto got = quantize_model(p);
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_EQ(got->files, want->files);
    for (const auto& f : want->files)
      EXPECT_EQ(file_bytes(p.checkpoint.out + "/" + f), file_bytes(o.out + "/" + f)) << f;
    if (awq) {
      ASSERT_EQ(log.size(), 1 + plan->report.size());
      EXPECT_EQ(log[0], "awq: 300 calibration tokens from random, searching scales...");
      EXPECT_EQ(log[1], "awq: " + plan->report[0]);
    } else {
      EXPECT_TRUE(log.empty());
    }
    fs::remove_all(o.out);
    fs::remove_all(p.checkpoint.out);
  }
}

}  // namespace
}  // namespace kvant
