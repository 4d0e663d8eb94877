// GLM-4.5 (Glm4MoeForCausalLM).
#include "model/archs/hf_config.h"

namespace kvant::archs {

Result<void> glm4_moe_from_hf(const json& j, const json& rp, const std::string& path,
                              ModelConfig& c) {
  // GQA with optional bias and QK-norm, RoPE on part of each head, and
  // DeepSeek-style routing: sigmoid, correction bias, groups, scaling,
  // shared experts, the first k layers dense.
  c.qkv_bias = j.value("attention_bias", false);
  c.qk_norm = j.value("use_qk_norm", false);
  const float partial = rp.value("partial_rotary_factor", j.value("partial_rotary_factor", 0.5f));
  c.rotary_dim = int64_t(float(c.head_dim) * partial);
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim)
    return make_error(path + ": inconsistent GLM-4.5 RoPE settings");
  KV_TRY(deepseek_routing(j, path, /*default_dense=*/1, c));
  return {};
}

}  // namespace kvant::archs
