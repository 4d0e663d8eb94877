// DeepSeek-V3 / Kimi K2 (DeepseekV3ForCausalLM) and GLM-5
// (GlmMoeDsaForCausalLM): multi-head latent attention (YaRN's softmax
// correction included), GLM-5's sparse-attention indexer and which layers
// run it, and DeepSeek routing.
#include <algorithm>
#include <cmath>

#include "model/archs/hf_config.h"

namespace kvant::archs {
namespace {

// `dsa`: GLM-5's form (interleaved RoPE always, the sparse-attention indexer).
Result<void> mla_from_hf(const json& j, const std::string& path, bool dsa, ModelConfig& c) {
  // Multi-head latent attention, and DeepSeek routing (sigmoid scores
  // with a correction bias, expert groups, routed scaling, shared
  // experts, the first k layers dense).
  auto opt_int = [&](const char* k) {
    return j.contains(k) && j[k].is_number() ? j[k].get<int64_t>() : int64_t(0);
  };
  c.kv_lora_rank = opt_int("kv_lora_rank");
  c.q_lora_rank = opt_int("q_lora_rank");
  c.qk_nope_dim = opt_int("qk_nope_head_dim");
  c.qk_rope_dim = opt_int("qk_rope_head_dim");
  c.v_head_dim = opt_int("v_head_dim");
  c.head_dim = c.qk_nope_dim + c.qk_rope_dim;
  c.kv_heads = c.heads;
  c.rotary_dim = c.qk_rope_dim;
  c.qkv_bias = j.value("attention_bias", false);
  if (c.qkv_bias) return make_error(path + ": attention_bias is not supported with MLA");
  c.rope_interleave = dsa || j.value("rope_interleave", true);
  c.attn_scale = 1.f / std::sqrt(float(c.head_dim));
  if (c.rope.scaling == RopeScaling::Yarn && c.rope.mscale_all_dim != 0.f && c.rope.factor > 1.f) {
    const float m = 0.1f * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.f;
    c.attn_scale *= m * m;
  }
  if (dsa) {
    c.index_topk = opt_int("index_topk");
    c.index_heads = opt_int("index_n_heads");
    c.index_head_dim = opt_int("index_head_dim");
    if (c.index_topk > 0) {
      if (c.index_heads <= 0 || c.index_head_dim < c.qk_rope_dim || c.index_head_dim > 1024 ||
          c.q_lora_rank <= 0)
        return make_error(path + ": sparse attention needs index_n_heads, qk_rope_head_dim <= "
                                 "index_head_dim <= 1024 and q_lora_rank");
      // Which layers run their own indexer: indexer_types, else every
      // freq-th layer from the offset (transformers' rule).
      c.index_full.assign(size_t(c.layers), 1);
      if (j.contains("indexer_types") && j["indexer_types"].is_array() &&
          int64_t(j["indexer_types"].size()) == c.layers) {
        for (int64_t i = 0; i < c.layers; ++i)
          c.index_full[size_t(i)] = j["indexer_types"][size_t(i)] != "shared";
      } else {
        const int64_t freq = std::max<int64_t>(1, j.value("index_topk_freq", int64_t(1)));
        const int64_t off = j.value("index_skip_topk_offset", int64_t(2));
        for (int64_t i = 0; i < c.layers; ++i)
          c.index_full[size_t(i)] = std::max<int64_t>(i - off + 1, 0) % freq == 0;
      }
      if (!c.index_full[0])
        return make_error(path + ": the first layer must run its own sparse-attention indexer");
    }
  }
  KV_TRY(deepseek_routing(j, path, /*default_dense=*/0, c));
  return {};
}

Result<void> deepseek_v3_from_hf(const HfInput& in, ModelConfig& c) {
  return mla_from_hf(in.j, in.path, /*dsa=*/false, c);
}

Result<void> glm_moe_dsa_from_hf(const HfInput& in, ModelConfig& c) {
  return mla_from_hf(in.j, in.path, /*dsa=*/true, c);
}

}  // namespace

extern const ArchSpec kDeepseekV3{
    .name = "deepseek_v3",
    .hf_classes = {"DeepseekV3ForCausalLM"},
    .hf_class = "DeepseekV3ForCausalLM",
    .hf_model_type = "deepseek_v3",
    .from_hf = deepseek_v3_from_hf,
};

extern const ArchSpec kGlmMoeDsa{
    .name = "glm_moe_dsa",
    .hf_classes = {"GlmMoeDsaForCausalLM"},
    .hf_class = "GlmMoeDsaForCausalLM",
    .hf_model_type = "glm_moe_dsa",
    .from_hf = glm_moe_dsa_from_hf,
};

}  // namespace kvant::archs
