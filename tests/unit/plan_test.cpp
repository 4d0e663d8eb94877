// KV capacity planning (engine/kv_plan): config -> cache shape for dense,
// GQA and MLA configs, tensor-parallel splitting, FP8 vs BF16 capacity, byte
// size parsing and the errors bad configs and options get. No model needed.
#include <gtest/gtest.h>

#include <string>

#include "engine/kv_plan.h"
#include "engine/weight_plan.h"
#include "io/json_text.h"

namespace kvant {
namespace {

using nlohmann::json;

constexpr int64_t kGiB = int64_t(1) << 30;

// SmolLM2-135M's attention sizes: 30 layers, 9 heads of 64 over 576, 3 KV heads.
json smollm2_config() {
  return json{{"architectures", json::array({"LlamaForCausalLM"})},
              {"hidden_size", 576},
              {"num_hidden_layers", 30},
              {"num_attention_heads", 9},
              {"num_key_value_heads", 3},
              {"vocab_size", 49152}};
}

KvCacheShape shape_of(const json& cfg) {
  auto s = kv_cache_shape_from_config(cfg);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? *s : KvCacheShape{};
}

KvPlan plan_of(const KvCacheShape& s, int64_t bytes, int64_t tp = 1,
               KvScaleMode scales = KvScaleMode::kStatic) {
  KvPlanOptions o;
  o.memory_bytes = bytes;
  o.tp = tp;
  o.fp8_scales = scales;
  auto p = make_kv_plan(s, o);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return p.ok() ? *p : KvPlan{};
}

std::string shape_error(const json& cfg) {
  auto s = kv_cache_shape_from_config(cfg);
  EXPECT_FALSE(s.ok());
  return s.ok() ? "" : s.error().message;
}

TEST(PlanConfig, SmolLM2DerivesHeadDim) {
  const KvCacheShape s = shape_of(smollm2_config());
  EXPECT_FALSE(s.mla);
  EXPECT_EQ(s.architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.layers, 30);
  EXPECT_EQ(s.kv_heads, 3);
  EXPECT_EQ(s.head_dim, 64);
  const KvPlan p = plan_of(s, 2 * kGiB);
  ASSERT_EQ(p.rows.size(), 3u);
  EXPECT_EQ(p.rows[0].dtype, KvDType::kBf16);
  EXPECT_EQ(p.rows[0].bytes_per_token, 23040.0);  // 30 * 2 (K, V) * 3 * 64 * 2 bytes
  EXPECT_EQ(p.rows[0].payload_bytes_per_token, 23040);
  EXPECT_EQ(p.rows[0].scale_bytes_per_token, 0);
  EXPECT_EQ(p.rows[1].bytes_per_token, 11520.0);
  EXPECT_EQ(p.rows[0].tokens, p.rows[0].pages * 16);
  EXPECT_EQ(p.rows[0].pages, 2 * kGiB / (23040 * 16));
}

TEST(PlanConfig, KvHeadsDefaultToAttentionHeadsAndHeadDimWins) {
  json cfg = smollm2_config();
  cfg.erase("num_key_value_heads");
  cfg["head_dim"] = 128;
  const KvCacheShape s = shape_of(cfg);
  EXPECT_EQ(s.kv_heads, 9);
  EXPECT_EQ(s.head_dim, 128);
  cfg["num_key_value_heads"] = nullptr;  // null counts as absent
  EXPECT_EQ(shape_of(cfg).kv_heads, 9);
}

TEST(PlanConfig, LlamaGoldenFixture) {
  auto cfg = read_json_file(std::string(KVANT_FIXTURES) + "/golden/llama3/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  const KvCacheShape s = shape_of(*cfg);
  EXPECT_EQ(s.layers, 3);
  EXPECT_EQ(s.kv_heads, 2);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(plan_of(s, kGiB).rows[0].bytes_per_token, 3.0 * 2 * 2 * 16 * 2);
}

TEST(PlanConfig, DeepSeekV3FixtureIsMla) {
  auto cfg = read_json_file(std::string(KVANT_FIXTURES) + "/plan/deepseek_v3_config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  const KvCacheShape s = shape_of(*cfg);
  EXPECT_TRUE(s.mla);
  EXPECT_EQ(s.layers, 61);
  EXPECT_EQ(s.kv_heads, 1);
  EXPECT_EQ(s.kv_lora_rank, 512);
  EXPECT_EQ(s.qk_rope_head_dim, 64);
  EXPECT_EQ(s.head_dim, 576);
  EXPECT_FALSE(s.notes.empty());  // the MTP layer is not counted, and says so
  const KvPlan p = plan_of(s, 2 * kGiB);
  EXPECT_EQ(p.rows[0].bytes_per_token, 70272.0);  // 61 * 576 * 2, one row for K and V
  EXPECT_EQ(p.rows[1].bytes_per_token, 35136.0);
  EXPECT_EQ(p.rows[0].pages, 2 * kGiB / (70272 * 16));
}

TEST(PlanConfig, MlaInsideTextConfigAndGlmDsa) {
  json inner = {{"num_hidden_layers", 61}, {"num_attention_heads", 64}, {"hidden_size", 7168},
                {"kv_lora_rank", 512},     {"qk_rope_head_dim", 64},    {"model_type", "kimi_k2"}};
  json kimi = {{"architectures", json::array({"KimiK25ForConditionalGeneration"})},
               {"text_config", inner}};
  const KvCacheShape k = shape_of(kimi);
  EXPECT_TRUE(k.mla);
  EXPECT_EQ(k.head_dim, 576);
  EXPECT_EQ(k.layers, 61);

  json glm = {{"architectures", json::array({"GlmMoeDsaForCausalLM"})},
              {"num_hidden_layers", 78},
              {"num_attention_heads", 64},
              {"kv_lora_rank", 512},
              {"qk_rope_head_dim", 64},
              {"index_head_dim", 128}};
  const KvCacheShape g = shape_of(glm);
  EXPECT_TRUE(g.mla);
  EXPECT_EQ(g.head_dim, 576);
  ASSERT_EQ(g.notes.size(), 1u);
  EXPECT_NE(g.notes[0].find("indexer"), std::string::npos);
  EXPECT_EQ(g.index_dim, 128);
  // The indexer's keys ride in the page: 78 x (576 + 128) x 2 bytes.
  EXPECT_EQ(plan_of(g, 2 * kGiB).rows[0].bytes_per_token, 78.0 * (576 + 128) * 2);

  // A dense text_config wins over stale top-level sizes.
  json wrapped = {{"num_hidden_layers", 2}, {"text_config", smollm2_config()}};
  EXPECT_EQ(shape_of(wrapped).layers, 30);
}

// The shipped real-model configs (tests/fixtures/plan/README.md): weight
// bytes against hand arithmetic, and the KV row of each.
WeightPlan weights_of(const std::string& file) {
  auto cfg = read_json_file(std::string(KVANT_FIXTURES) + "/plan/" + file);
  EXPECT_TRUE(cfg.ok());
  auto w = weight_plan_from_config(cfg.ok() ? *cfg : json::object());
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().message);
  return w.ok() ? *w : WeightPlan{};
}

const WeightPolicyBytes& policy(const WeightPlan& w, const std::string& name) {
  for (const auto& p : w.policies)
    if (p.name == name) return p;
  ADD_FAILURE() << "no policy " << name;
  return w.policies.front();
}

TEST(PlanWeights, TensorBytesPerFormat) {
  // [2048, 7168]: BF16 2 B each; FP8 1 B plus an FP32 scale per 128x128
  // tile (16 x 56); INT4 half a byte plus a BF16 scale per 32 of a row.
  EXPECT_EQ(weight_tensor_bytes(WeightFormat::kBf16, 2048, 7168), 2.0 * 2048 * 7168);
  EXPECT_EQ(weight_tensor_bytes(WeightFormat::kFp8Block, 2048, 7168), 2048.0 * 7168 + 4 * 16 * 56);
  EXPECT_EQ(weight_tensor_bytes(WeightFormat::kInt4, 2048, 7168), 2048.0 * 7168 / 2 + 2.0 * 2048 * 224);
  EXPECT_EQ(weight_tensor_bytes(WeightFormat::kFp8Block, 130, 129), 130.0 * 129 + 4 * 2 * 2);
}

TEST(PlanWeights, KimiK26) {
  const WeightPlan w = weights_of("kimi_k2.6_config.json");
  // 60 MoE layers x 384 experts x 3 projections of 7168 x 2048.
  EXPECT_EQ(w.expert_params, int64_t(60) * 384 * 3 * 7168 * 2048);
  EXPECT_EQ(w.params, w.params_no_mtp);  // no MTP layer
  // Native = compressed-tensors INT4 g32 on the routed experts only (the
  // ignore list keeps attention, shared experts, the dense layer, lm_head):
  // the same bytes as the "int4" policy.
  EXPECT_EQ(policy(w, "native").bytes, policy(w, "int4").bytes);
  EXPECT_NEAR(policy(w, "native").expert_bytes,
              double(w.expert_params) * (0.5 + 2.0 / 32), 1.0);
  EXPECT_NEAR(policy(w, "native").bytes / 1e9, 594.2, 0.1);
  EXPECT_NEAR(double(w.params) / 1e9, 1026.4, 0.1);
  auto cfg = read_json_file(std::string(KVANT_FIXTURES) + "/plan/kimi_k2.6_config.json");
  const KvPlan p = plan_of(shape_of(*cfg), 2 * kGiB, 8);
  EXPECT_EQ(p.rows[0].bytes_per_token, 70272.0);  // 61 x (512 + 64) x 2, every rank
}

TEST(PlanWeights, Glm52) {
  const WeightPlan w = weights_of("glm_5.2_config.json");
  EXPECT_EQ(w.expert_params, int64_t(75) * 256 * 3 * 6144 * 2048);
  EXPECT_GT(w.params, w.params_no_mtp);  // one MTP layer in the checkpoint
  // Native FP8 blocks = the all-FP8 policy here (only lm_head, embeddings
  // and the indexer's weights_proj stay BF16 either way).
  EXPECT_NEAR(policy(w, "native").bytes, policy(w, "fp8").bytes,
              2.0 * 6144 * 32 * 79);  // weights_proj: BF16 in native, FP8 in "fp8"
  // The published 705 -> 421 (GiB) for the FP8 and INT4-expert checkpoints.
  EXPECT_NEAR(policy(w, "native").bytes / double(kGiB), 704.2, 0.5);
  EXPECT_NEAR(policy(w, "int4").bytes / double(kGiB), 421.0, 0.5);
}

TEST(PlanWeights, CompressedTensorsFp8IsNativeFp8) {
  // A compressed-tensors float-quantized checkpoint (kvant quantize --format
  // fp8 writes one): native = FP8 on every linear the ignore list allows.
  auto cfg = read_json_file(std::string(KVANT_FIXTURES) + "/fp8/ct_qwen3/config.json");
  ASSERT_TRUE(cfg.ok());
  auto w = weight_plan_from_config(*cfg);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(policy(*w, "native").bytes, policy(*w, "fp8").bytes);
  EXPECT_LT(policy(*w, "native").bytes, policy(*w, "bf16").bytes);
}

TEST(PlanCapacity, TensorParallelSplitsHeadsButReplicatesLatent) {
  json cfg = smollm2_config();
  cfg["num_attention_heads"] = 32;
  cfg["num_key_value_heads"] = 8;
  cfg["head_dim"] = 128;
  const KvCacheShape s = shape_of(cfg);
  const double tp1 = plan_of(s, kGiB, 1).rows[0].bytes_per_token;
  const KvPlan tp2 = plan_of(s, kGiB, 2);
  EXPECT_EQ(tp2.kv_heads_per_rank, 4);
  EXPECT_FALSE(tp2.replicated);
  EXPECT_EQ(tp2.rows[0].bytes_per_token * 2, tp1);
  EXPECT_EQ(plan_of(s, kGiB, 3).kv_heads_per_rank, 3);  // ceil(8 / 3)
  const KvPlan tp16 = plan_of(s, kGiB, 16);
  EXPECT_EQ(tp16.kv_heads_per_rank, 1);
  EXPECT_TRUE(tp16.replicated);

  auto cfg_ds = read_json_file(std::string(KVANT_FIXTURES) + "/plan/deepseek_v3_config.json");
  ASSERT_TRUE(cfg_ds.ok());
  const KvCacheShape ds = shape_of(*cfg_ds);
  const KvPlan ds8 = plan_of(ds, 2 * kGiB, 8);
  EXPECT_TRUE(ds8.replicated);
  EXPECT_EQ(ds8.kv_heads_per_rank, 1);
  EXPECT_EQ(ds8.rows[0].bytes_per_token, 70272.0);  // every rank holds the whole latent
  EXPECT_EQ(ds8.rows[0].tokens, plan_of(ds, 2 * kGiB, 1).rows[0].tokens);
  EXPECT_NE(kv_plan_to_text(ds8).find("full copy"), std::string::npos);
}

TEST(PlanCapacity, Fp8StaticHoldsAtLeast1p9xBf16) {
  auto cfg_ds = read_json_file(std::string(KVANT_FIXTURES) + "/plan/deepseek_v3_config.json");
  ASSERT_TRUE(cfg_ds.ok());
  const json configs[] = {smollm2_config(), *cfg_ds};
  for (const json& cfg : configs) {
    for (int64_t bytes : {int64_t(256) << 20, 2 * kGiB, 80 * kGiB}) {
      const KvPlan p = plan_of(shape_of(cfg), bytes);
      ASSERT_EQ(p.rows.size(), 3u);
      for (size_t i = 1; i < 3; ++i) {
        EXPECT_EQ(p.rows[i].scales, KvScaleMode::kStatic);
        EXPECT_GE(double(p.rows[i].tokens), 1.9 * double(p.rows[0].tokens)) << bytes;
        EXPECT_GE(p.rows[i].ratio_vs_bf16, 1.9);
        EXPECT_GT(p.rows[i].static_scale_bytes, 0);
      }
      EXPECT_EQ(p.rows[0].ratio_vs_bf16, 1.0);
    }
  }
}

TEST(PlanCapacity, DynamicScalesAreCountedPerToken) {
  const KvPlan p = plan_of(shape_of(smollm2_config()), 2 * kGiB, 1, KvScaleMode::kDynamic);
  const KvPlanRow& r = p.rows[1];
  EXPECT_EQ(r.scales, KvScaleMode::kDynamic);
  EXPECT_EQ(r.payload_bytes_per_token, 30 * 2 * 3 * 64);
  EXPECT_EQ(r.scale_bytes_per_token, 30 * 2 * 3 * 2);  // BF16 per (token, layer, head, K/V)
  EXPECT_GE(r.bytes_per_token, double(r.payload_bytes_per_token + r.scale_bytes_per_token));
  EXPECT_EQ(r.static_scale_bytes, 0);
  EXPECT_LT(r.tokens, p.rows[0].tokens * 2);
}

TEST(PlanCapacity, RatioIsAgainstBf16EvenWhenNotRequested) {
  KvPlanOptions o;
  o.memory_bytes = 2 * kGiB;
  o.dtypes = {KvDType::kFp8E4m3};
  auto p = make_kv_plan(shape_of(smollm2_config()), o);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->rows.size(), 1u);
  EXPECT_NEAR(p->rows[0].ratio_vs_bf16, 2.0, 0.01);
}

TEST(PlanCapacity, TinyBudgetGivesZeroPages) {
  const KvPlan p = plan_of(shape_of(smollm2_config()), 1000);
  for (const KvPlanRow& r : p.rows) EXPECT_EQ(r.tokens, 0);
  const json j = kv_plan_to_json(p);
  EXPECT_TRUE(j["dtypes"][1]["ratio_vs_bf16"].is_null());
}

TEST(PlanCapacity, JsonAndTextCarryTheFigures) {
  const KvPlan p = plan_of(shape_of(smollm2_config()), 2 * kGiB, 1);
  const json j = kv_plan_to_json(p);
  EXPECT_EQ(j["layers"], 30);
  EXPECT_EQ(j["attention"], "mha");
  EXPECT_EQ(j["memory_bytes_per_rank"], 2 * kGiB);
  ASSERT_EQ(j["dtypes"].size(), 3u);
  EXPECT_EQ(j["dtypes"][0]["kv_dtype"], "bf16");
  EXPECT_EQ(j["dtypes"][0]["bytes_per_token_per_rank"], 23040.0);
  EXPECT_EQ(j["dtypes"][0]["tokens"], p.rows[0].tokens);
  EXPECT_EQ(j["dtypes"][1]["kv_dtype"], "fp8_e4m3");
  const std::string t = kv_plan_to_text(p);
  EXPECT_NE(t.find("23,040"), std::string::npos) << t;
  EXPECT_NE(t.find("fp8_e5m2"), std::string::npos);
}

TEST(PlanBytes, AcceptsIntegersAndUnits) {
  auto v = [](const char* s) {
    auto r = parse_byte_size(s);
    EXPECT_TRUE(r.ok()) << s << ": " << (r.ok() ? "" : r.error().message);
    return r.ok() ? *r : -1;
  };
  EXPECT_EQ(v("1073741824"), kGiB);
  EXPECT_EQ(v("2GiB"), 2 * kGiB);
  EXPECT_EQ(v("2gib"), 2 * kGiB);
  EXPECT_EQ(v(" 2 GiB "), 2 * kGiB);
  EXPECT_EQ(v("512MiB"), int64_t(512) << 20);
  EXPECT_EQ(v("80GB"), int64_t(80'000'000'000));
  EXPECT_EQ(v("1.5TiB"), int64_t(3) << 39);
  EXPECT_EQ(v("0.5KiB"), 512);
  EXPECT_EQ(v("1.0001KB"), 1000);  // rounds down to whole bytes
  EXPECT_EQ(v("100B"), 100);
}

TEST(PlanBytes, RejectsBadValuesWithAMessage) {
  for (const char* s :
       {"", "  ", "abc", "-1", "-2GiB", "0", "0GiB", "2G", "2g", "2 XB", "1.5", "1.GiB", "GiB",
        "2GiBs", "1e9", "8EiB", "9223372036854775808", "99999999999999999999999TiB", "9PiB0"}) {
    auto r = parse_byte_size(s);
    EXPECT_FALSE(r.ok()) << "'" << s << "' parsed as " << (r.ok() ? *r : 0);
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("memory size"), std::string::npos) << s;
    }
  }
  auto g = parse_byte_size("2G");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("ambiguous"), std::string::npos);
}

TEST(PlanErrors, MissingAndMalformedFields) {
  json cfg = smollm2_config();
  cfg.erase("num_hidden_layers");
  EXPECT_NE(shape_error(cfg).find("num_hidden_layers"), std::string::npos);

  cfg = smollm2_config();
  cfg["num_hidden_layers"] = "thirty";
  EXPECT_NE(shape_error(cfg).find("num_hidden_layers"), std::string::npos);
  cfg["num_hidden_layers"] = -4;
  EXPECT_NE(shape_error(cfg).find("positive"), std::string::npos);
  cfg["num_hidden_layers"] = 2.5;
  EXPECT_FALSE(kv_cache_shape_from_config(cfg).ok());
  cfg["num_hidden_layers"] = 1e30;
  EXPECT_FALSE(kv_cache_shape_from_config(cfg).ok());

  cfg = smollm2_config();
  cfg.erase("num_attention_heads");
  cfg.erase("num_key_value_heads");
  EXPECT_NE(shape_error(cfg).find("num_key_value_heads"), std::string::npos);

  cfg = smollm2_config();
  cfg.erase("hidden_size");
  EXPECT_NE(shape_error(cfg).find("head_dim"), std::string::npos);

  cfg = smollm2_config();
  cfg["hidden_size"] = 577;
  EXPECT_NE(shape_error(cfg).find("multiple"), std::string::npos);

  cfg = smollm2_config();
  cfg["num_key_value_heads"] = 4;  // 9 heads do not group into 4
  EXPECT_NE(shape_error(cfg).find("num_key_value_heads"), std::string::npos);

  EXPECT_FALSE(kv_cache_shape_from_config(json::array({1, 2})).ok());
  EXPECT_FALSE(kv_cache_shape_from_config(json()).ok());
}

TEST(PlanErrors, MlaConfigsNeedBothLatentFields) {
  json ds = {{"architectures", json::array({"DeepseekV3ForCausalLM"})},
             {"num_hidden_layers", 61},
             {"num_attention_heads", 128},
             {"qk_rope_head_dim", 64}};
  EXPECT_NE(shape_error(ds).find("kv_lora_rank"), std::string::npos);
  ds["kv_lora_rank"] = 512;
  ds.erase("qk_rope_head_dim");
  EXPECT_NE(shape_error(ds).find("qk_rope_head_dim"), std::string::npos);
}

TEST(PlanErrors, BadJsonAndBadOptions) {
  EXPECT_FALSE(parse_json_text("{\"num_hidden_layers\": 30,", "config.json").ok());
  EXPECT_FALSE(parse_json_text("not json", "config.json").ok());
  auto missing = read_json_file(std::string(KVANT_FIXTURES) + "/plan/no_such_config.json");
  EXPECT_FALSE(missing.ok());

  const KvCacheShape s = shape_of(smollm2_config());
  KvPlanOptions o;
  o.memory_bytes = kGiB;
  o.tp = 0;
  EXPECT_FALSE(make_kv_plan(s, o).ok());
  o.tp = 1;
  o.page_tokens = 0;
  EXPECT_FALSE(make_kv_plan(s, o).ok());
  o.page_tokens = 16;
  o.memory_bytes = 0;
  EXPECT_FALSE(make_kv_plan(s, o).ok());
  o.memory_bytes = kGiB;
  o.dtypes = {KvDType::kFp8E4m3};
  o.fp8_scales = KvScaleMode::kNone;
  EXPECT_FALSE(make_kv_plan(s, o).ok());
  KvPlanOptions fine;
  fine.memory_bytes = kGiB;
  EXPECT_FALSE(make_kv_plan(KvCacheShape{}, fine).ok());
}

}  // namespace
}  // namespace kvant
