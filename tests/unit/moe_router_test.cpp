// MoE routing against transformers' own routers (tools/fixtures/gen_router.py):
// DeepseekV3TopkRouter (sigmoid, correction bias, group-limited top-k,
// scaling; DeepSeek-V3 / Kimi K2 and GLM-4.5 settings) and Qwen3MoeTopKRouter
// (softmax top-k), with and without renormalisation. The same experts, and
// weights within 2e-6 relative (FP32 exp and sums in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/moe_router.h"

namespace kvant {
namespace {

class MoeRouter : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeRouter, MatchesTransformers) {
  std::ifstream f(std::string(KVANT_FIXTURES) + "/moe/router_" + GetParam() + ".json");
  ASSERT_TRUE(bool(f));
  const auto j = nlohmann::json::parse(f);
  const auto& cj = j["config"];
  RouterConfig c;
  c.scoring = cj["scoring"] == "sigmoid" ? RouterScoring::kSigmoid : RouterScoring::kSoftmax;
  c.n_experts = cj["n_experts"];
  c.top_k = cj["top_k"];
  c.n_group = cj["n_group"];
  c.topk_group = cj["topk_group"];
  c.norm_topk_prob = cj["norm_topk_prob"];
  c.routed_scaling_factor = cj["routed_scaling_factor"];
  std::vector<float> logits, bias;
  for (const auto& row : j["logits"])
    for (float v : row) logits.push_back(v);
  if (!j["bias"].is_null()) bias = j["bias"].get<std::vector<float>>();
  const int64_t T = int64_t(j["logits"].size());
  std::vector<int32_t> ids(size_t(T * c.top_k));
  std::vector<float> w(ids.size()), scratch(size_t(router_scratch_size(c)));
  route_tokens(c, logits.data(), bias.empty() ? nullptr : bias.data(), T, ids.data(), w.data(),
               scratch.data());
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < c.top_k; ++i) {
      const size_t at = size_t(t * c.top_k + i);
      EXPECT_EQ(ids[at], j["ids"][t][i].get<int32_t>()) << GetParam() << " token " << t;
      const float want = j["weights"][t][i];
      EXPECT_NEAR(w[at], want, 2e-6f * std::fabs(want) + 1e-7f) << GetParam() << " token " << t;
    }
}

INSTANTIATE_TEST_SUITE_P(Transformers, MoeRouter,
                         ::testing::Values("deepseek_groups", "glm45", "sigmoid_unnormalized",
                                           "qwen3_norm", "qwen3_plain"));

TEST(MoeRouterGroups, ChoiceStaysInsideTheBestGroups) {
  // 8 experts in 4 groups of 2, 2 groups kept: group 3 holds the single best
  // expert but its pair sums lower than groups 0 and 1, so expert 6 is out.
  RouterConfig c{RouterScoring::kSigmoid, 8, 2, 4, 2, false, 1.f};
  const float logits[8] = {2.f, 2.f, 1.9f, 1.9f, -5.f, -5.f, 4.f, -6.f};
  int32_t ids[2];
  float w[2], scratch[20];
  route_tokens(c, logits, nullptr, 1, ids, w, scratch);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
}

}  // namespace
}  // namespace kvant
