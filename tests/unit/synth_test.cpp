// kvant synth: the scaled config keeps the architecture's rules and takes
// sizes the kernels accept, and the checkpoint it writes loads and runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "io/json_text.h"
#include "model/model.h"
#include "model_test_util.h"
#include "quant/synth.h"

namespace kvant {
namespace {

namespace fs = std::filesystem;

nlohmann::json kimi() {
  auto c = read_json_file(std::string(KVANT_FIXTURES) + "/plan/kimi_k2.6_config.json");
  EXPECT_TRUE(c.ok());
  return c.ok() ? *c : nlohmann::json::object();
}

TEST(Synth, ScalesSizesAndKeepsRouting) {
  auto c = synth_config(kimi(), 0.125, 0);
  ASSERT_TRUE(c.ok()) << c.error().message;
  const auto& j = *c;
  EXPECT_EQ(j["architectures"][0], "DeepseekV3ForCausalLM");  // the text decoder, flattened
  EXPECT_EQ(j["hidden_size"], 896);                          // 7168 / 8
  EXPECT_EQ(j["kv_lora_rank"], 64);                          // 512 / 8
  EXPECT_EQ(j["q_lora_rank"], 192);
  EXPECT_EQ(j["qk_rope_head_dim"], 8);
  EXPECT_EQ(j["num_attention_heads"], 8);
  EXPECT_EQ(j["num_key_value_heads"], 8);  // MLA: one per head
  EXPECT_EQ(j["n_routed_experts"], 48);    // 384 / 8
  EXPECT_EQ(j["num_experts_per_tok"], 8);  // top-k kept
  EXPECT_EQ(j["num_hidden_layers"], 8);    // 61 / 8, rounded
  EXPECT_EQ(j["first_k_dense_replace"], 1);
  EXPECT_EQ(j["vocab_size"], 20480);
  EXPECT_FALSE(j.contains("quantization_config"));
  EXPECT_EQ(j["rope_scaling"]["type"], "yarn");
  EXPECT_FALSE(synth_config(kimi(), 0, 0).ok());
  EXPECT_FALSE(synth_config(kimi(), 1.5, 0).ok());
}

TEST(Synth, CheckpointLoadsAndRuns) {
  for (const char* like : {"/plan/kimi_k2.6_config.json", "/plan/glm_5.2_config.json"}) {
    SynthOptions o;
    o.like = std::string(KVANT_FIXTURES) + like;
    o.out = (fs::temp_directory_path() / ("kvant_synth_" + std::to_string(::getpid()))).string();
    o.scale = 0.03;
    auto s = synth_checkpoint(o);
    ASSERT_TRUE(s.ok()) << s.error().message;
    auto m = Model::load(o.out);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const auto& c = (*m)->config();
    EXPECT_TRUE(c.mla());
    EXPECT_GT(c.n_experts, 0);
    std::vector<int32_t> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(int32_t((i * 37) % c.vocab));
    const auto pre = test::run_chunked(**m, ids, 12);
    const auto dec = test::run_chunked(**m, ids, 1);
    for (float x : pre) ASSERT_TRUE(std::isfinite(x));
    // Prefill (expanded K/V) and decode (absorbed) agree on a random model.
    EXPECT_LT(test::mean_kl(pre, dec, c.vocab), 1e-3) << like;
    fs::remove_all(o.out);
  }
}

TEST(Synth, MtpLayerLoadsAndDrafts) {
  // --mtp: one MTP layer after the main ones, loaded with WeightOptions::mtp
  // and run over a forward's rows (GLM-5: latent attention, the indexer).
  SynthOptions o;
  o.like = std::string(KVANT_FIXTURES) + "/plan/glm_5.2_config.json";
  o.out = (fs::temp_directory_path() / ("kvant_synth_mtp_" + std::to_string(::getpid()))).string();
  o.scale = 0.03;
  o.mtp = true;
  auto s = synth_checkpoint(o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->config["num_nextn_predict_layers"], 1);
  WeightOptions wo;
  wo.mtp = true;
  auto m = Model::load(o.out, wo);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const auto& c = (*m)->config();
  ASSERT_EQ(c.mtp_layers, 1);
  std::vector<int32_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(int32_t((i * 37) % c.vocab));
  SeqKv kv(c, 16);
  std::vector<float> main(size_t(c.vocab)), draft(size_t(c.vocab));
  Batch b;
  b.tokens.assign(ids.begin(), ids.end() - 1);
  b.seqs.push_back({&kv, 0, 11, false});
  ASSERT_TRUE((*m)->forward(b, main).ok());
  Batch d;
  d.tokens.assign(ids.begin() + 1, ids.end());
  d.seqs.push_back({&kv, 0, 11, false});
  const int64_t src = 0;
  ASSERT_TRUE((*m)->forward_mtp(d, {&src, 1}, draft).ok());
  for (float x : draft) ASSERT_TRUE(std::isfinite(x));
  fs::remove_all(o.out);
}

}  // namespace
}  // namespace kvant
