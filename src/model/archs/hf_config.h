// What the family files in model/archs/ share: the spec (arch.h) and the
// config.json helpers more than one family uses. Private to model/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"
#include "model/archs/arch.h"
#include "model/config.h"

namespace kvant::archs {

using json = nlohmann::json;

// A RoPE block (rope_parameters, or rope_scaling merged over the top level).
RopeConfig rope_from_json(const json& p, float default_theta);
// DeepSeek-style routing (DeepSeek-V3, Kimi K2, GLM-4.5, GLM-5): sigmoid
// scores with a correction bias, expert groups, routed scaling, shared
// experts; the first k layers dense (then every moe_layer_freq-th sparse),
// unless mlp_layer_types lists each layer.
Result<void> deepseek_routing(const json& j, const std::string& path, int64_t default_dense,
                              ModelConfig& c);
// config.json's attention_bias (default false) as qkv_bias.
inline Result<void> read_attention_bias(const HfInput& in, ModelConfig& c) {
  c.qkv_bias = in.j.value("attention_bias", false);
  return {};
}

}  // namespace kvant::archs
