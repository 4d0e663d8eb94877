// config.json mapping shared by the per-family files in model/archs/ (one
// file per architecture family: its hyper-parameters beyond the common
// fields config.cpp reads). Private to model/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"
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

// Each family's fields; `rp` is the merged RoPE block, `theta` the top-level base.
Result<void> gemma3_from_hf(const json& j, const json& rp, float theta, ModelConfig& c);
Result<void> mla_from_hf(const json& j, const std::string& path, ModelConfig& c);
Result<void> glm4_moe_from_hf(const json& j, const json& rp, const std::string& path,
                              ModelConfig& c);
Result<void> qwen3_moe_from_hf(const json& j, const std::string& path, ModelConfig& c);

}  // namespace kvant::archs
