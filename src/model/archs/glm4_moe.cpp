// GLM-4.5 (Glm4MoeForCausalLM).
#include "model/archs/hf_config.h"

namespace kvant::archs {
namespace {

Result<void> glm4_moe_from_hf(const HfInput& in, ModelConfig& c) {
  const json& j = in.j;
  // GQA with optional bias and QK-norm, RoPE on part of each head, and
  // DeepSeek-style routing: sigmoid, correction bias, groups, scaling,
  // shared experts, the first k layers dense.
  c.qkv_bias = j.value("attention_bias", false);
  c.qk_norm = j.value("use_qk_norm", false);
  const float partial =
      in.rope.value("partial_rotary_factor", j.value("partial_rotary_factor", 0.5f));
  c.rotary_dim = int64_t(float(c.head_dim) * partial);
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)
    return make_error(in.path + ": inconsistent GLM-4.5 RoPE settings");
  KV_TRY(deepseek_routing(j, in.path, /*default_dense=*/1, c));
  return {};
}

}  // namespace

extern const ArchSpec kGlm4Moe{
    .name = "glm4_moe",
    .hf_classes = {"Glm4MoeForCausalLM"},
    .hf_class = "Glm4MoeForCausalLM",
    .hf_model_type = "glm4_moe",
    .from_hf = glm4_moe_from_hf,
};

}  // namespace kvant::archs
