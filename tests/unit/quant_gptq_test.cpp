// GPTQ (quant/gptq.h, quant/gptq_plan.h):
//  - with a diagonal Hessian nothing is propagated, so GPTQ is RTN exactly;
//  - with correlated inputs it lowers the output error tr(D H D^T) below
//    RTN's (dynamic and act-order groups; act-order keeps RTN's scales);
//  - a column that never sees an input is quantized as zero;
//  - whole models: the checkpoint written with GPTQ (and AWQ + GPTQ) loads as
//    INT4 and is closer to the BF16 model than RTN on the calibration text;
//    --clip brings GPTQ closer still and AWQ no further away.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "model/model.h"
#include "model_test_util.h"
#include "numerics/int4_rtn.h"
#include "quant/gptq.h"
#include "quant/gptq_plan.h"
#include "quant/quantize_pipeline.h"

namespace kvant {
namespace {

namespace fs = std::filesystem;

std::vector<float> random_w(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.05f);
  std::vector<float> w(size_t(rows * cols));
  for (auto& x : w) x = d(rng);
  return w;
}

// H = X^T X for n rows of inputs with a few strong shared directions.
std::vector<double> correlated_h(int64_t cols, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> base(size_t(4 * cols));
  for (auto& b : base) b = d(rng);
  std::vector<double> H(size_t(cols * cols), 0.0), x(static_cast<size_t>(cols));
  for (int64_t r = 0; r < n; ++r) {
    const double a[4] = {d(rng), d(rng), d(rng), d(rng)};
    for (int64_t c = 0; c < cols; ++c) {
      x[size_t(c)] = 0.3 * d(rng) * (1.0 + double(c % 7));
      for (int k = 0; k < 4; ++k) x[size_t(c)] += a[k] * base[size_t(k * cols + c)];
    }
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j) H[size_t(i * cols + j)] += x[size_t(i)] * x[size_t(j)];
  }
  return H;
}

TEST(Gptq, DiagonalHessianIsRtn) {
  const int64_t rows = 20, cols = 96;
  const auto w = random_w(rows, cols, 1);
  std::vector<double> H(size_t(cols * cols), 0.0);
  for (int64_t i = 0; i < cols; ++i) H[size_t(i * cols + i)] = 1.0 + double(i % 5);
  for (bool asym : {false, true}) {
    GptqOptions o;
    o.group = 32;
    o.asym = asym;
    auto g = gptq_quantize(w.data(), rows, cols, H, o);
    ASSERT_TRUE(g.ok()) << g.error().message;
    const Int4Weight r = rtn_quantize(w.data(), rows, cols, 32, asym);
    EXPECT_EQ(g->q, r.q);
    EXPECT_EQ(g->scale, r.scale);
    EXPECT_EQ(g->zero, r.zero);
  }
}

TEST(Gptq, LowersTheOutputErrorBelowRtn) {
  const int64_t rows = 48, cols = 160;  // a short last group of 32 at g64
  const auto w = random_w(rows, cols, 2);
  const auto H = correlated_h(cols, 400, 3);
  for (bool act_order : {false, true})
    for (bool asym : {false, true}) {
      GptqOptions o;
      o.group = 64;
      o.asym = asym;
      o.act_order = act_order;
      GptqStats st;
      auto g = gptq_quantize(w.data(), rows, cols, H, o, &st);
      ASSERT_TRUE(g.ok()) << g.error().message;
      std::printf("gptq act_order=%d asym=%d: output error %.4g vs RTN %.4g\n", act_order, asym,
                  st.err_gptq, st.err_rtn);
      EXPECT_LT(st.err_gptq, 0.8 * st.err_rtn);
      for (int8_t q : g->q) ASSERT_TRUE(q >= -8 && q <= 7);
      if (act_order) {  // static groups: RTN's own scales
        const Int4Weight r = rtn_quantize(w.data(), rows, cols, 64, asym);
        EXPECT_EQ(g->scale, r.scale);
        EXPECT_EQ(g->zero, r.zero);
      }
    }
}

// The clip search inside GPTQ: lower output error than without it, in both
// group modes.
TEST(Gptq, ClippedGroupsLowerTheOutputErrorFurther) {
  const int64_t rows = 48, cols = 256;
  const auto w = random_w(rows, cols, 12);
  const auto H = correlated_h(cols, 600, 13);
  for (bool act_order : {false, true}) {
    GptqOptions o;
    o.group = 128;
    o.act_order = act_order;
    GptqStats plain, clip;
    ASSERT_TRUE(gptq_quantize(w.data(), rows, cols, H, o, &plain).ok());
    o.clip = true;
    auto g = gptq_quantize(w.data(), rows, cols, H, o, &clip);
    ASSERT_TRUE(g.ok()) << g.error().message;
    std::printf("gptq act_order=%d: output error %.4g, with clip %.4g (RTN %.4g)\n", act_order,
                plain.err_gptq, clip.err_gptq, plain.err_rtn);
    EXPECT_LT(clip.err_gptq, plain.err_gptq);
  }
}

TEST(Gptq, DeadColumnsQuantizeToZero) {
  const int64_t rows = 8, cols = 64;
  const auto w = random_w(rows, cols, 4);
  auto H = correlated_h(cols, 200, 5);
  for (int64_t k = 0; k < cols; ++k) H[size_t(5 * cols + k)] = H[size_t(k * cols + 5)] = 0;
  GptqOptions o;
  o.group = 32;
  auto g = gptq_quantize(w.data(), rows, cols, H, o);
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<float> back(size_t(rows * cols));
  dequantize(*g, back.data());
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(back[size_t(r * cols + 5)], 0.f);
}

TEST(Gptq, SizeMismatchIsAnError) {
  const auto w = random_w(4, 32, 6);
  auto g = gptq_quantize(w.data(), 4, 32, std::vector<double>(10), GptqOptions{});
  ASSERT_FALSE(g.ok());
}

class GptqModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GptqModelTest, CheckpointIsCloserThanRtnOnTheCalibrationText) {
  const std::string in = std::string(KVANT_FIXTURES) + "/golden/" + GetParam();
  auto ref = Model::load(in, {WeightPrecision::kBf16, WeightPrecision::kBf16});
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  const auto& c = (*ref)->config();
  std::mt19937 rng(7);
  std::vector<int32_t> calib(256);
  for (auto& t : calib) t = int32_t(rng() % uint32_t(c.vocab));
  const std::vector<int32_t> ids(calib.begin(), calib.begin() + 64);
  const auto base = test::run_chunked(**ref, ids, int64_t(ids.size()));
  auto run = [&](bool awq, bool gptq, const std::string& tag, bool clip = false) {
    QuantizePipelineOptions p;
    p.checkpoint.in = in;
    p.checkpoint.out =
        (fs::temp_directory_path() / ("kvant_gptq_" + tag + "_" + std::to_string(::getpid()))).string();
    p.checkpoint.group_size = 32;
    p.awq = awq;
    p.gptq = gptq;
    p.clip = clip;
    p.calib_tokens = calib;
    p.calib_source = "random";
    p.calib_chunk = 64;
    p.calib_rows = 128;
    auto s = quantize_model(p);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    auto m = Model::load(p.checkpoint.out);
    EXPECT_TRUE(m.ok());
    double kl = 1e9;
    if (m.ok()) {
      EXPECT_EQ((*m)->set_precision(0), "int4");
      kl = test::mean_kl(base, test::run_chunked(**m, ids, int64_t(ids.size())), c.vocab);
    }
    fs::remove_all(p.checkpoint.out);
    return kl;
  };
  const double rtn = run(false, false, "rtn"), gptq = run(false, true, "gptq"),
               both = run(true, true, "awq_gptq"), gptq_clip = run(false, true, "gptq_clip", true),
               awq = run(true, false, "awq"), awq_clip = run(true, false, "awq_clip", true);
  std::printf("%s INT4 g32 KL on the calibration text: rtn %.5f, gptq %.5f, awq+gptq %.5f, "
              "gptq --clip %.5f, awq %.5f, awq --clip %.5f\n",
              GetParam().c_str(), rtn, gptq, both, gptq_clip, awq, awq_clip);
  EXPECT_LT(gptq, rtn);
  EXPECT_LT(both, rtn);
  EXPECT_LT(gptq_clip, gptq);
  // AWQ on these random fixtures gains little over RTN (gemma3: nothing);
  // the clip search must not lose against it beyond noise.
  EXPECT_LT(awq_clip, awq * 1.02);
}

// The sink weight adds (w - 1) x0 x0^T per chunk (x0: the chunk's first
// row) to each Hessian: H(9) - H(1) is 8 (H(2) - H(1)), and it is not zero.
TEST(GptqPlan, SinkWeightScalesTheFirstPositionsTerm) {
  auto m = Model::load(std::string(KVANT_FIXTURES) + "/golden/llama3",
                       {WeightPrecision::kBf16, WeightPrecision::kBf16});
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::mt19937 rng(3);
  std::vector<int32_t> calib(128);
  for (auto& t : calib) t = int32_t(rng() % uint32_t((*m)->config().vocab));
  auto plan = [&](double w) {
    GptqOptions o;
    o.sink_weight = w;
    auto p = gptq_plan(**m, calib, 64, o);
    EXPECT_TRUE(p.ok());
    return p.ok() ? p->hessian : std::vector<std::vector<double>>{};
  };
  const auto h1 = plan(1.0), h2 = plan(2.0), h9 = plan(9.0);
  ASSERT_EQ(h1.size(), h9.size());
  for (size_t k = 0; k < h1.size(); ++k) {
    double scale = 0, worst = 0, extra = 0;
    for (size_t i = 0; i < h1[k].size(); ++i) {
      const double d2 = h2[k][i] - h1[k][i], d9 = h9[k][i] - h1[k][i];
      scale = std::max(scale, std::fabs(d9));
      worst = std::max(worst, std::fabs(d9 - 8 * d2));
      extra += d2 * (i % (size_t(std::sqrt(double(h1[k].size()))) + 1) == 0 ? 1 : 0);  // trace
    }
    EXPECT_GT(extra, 0) << "product " << k;
    EXPECT_LE(worst, 1e-4 * scale) << "product " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, GptqModelTest, ::testing::Values("llama3", "gemma3"));

}  // namespace
}  // namespace kvant
