// RoPE blocks and DeepSeek-style routing from config.json (hf_config.h).
#include <algorithm>
#include <cmath>

#include "model/archs/hf_config.h"

namespace kvant::archs {

RopeConfig rope_from_json(const json& p, float default_theta) {
  RopeConfig r;
  r.theta = p.value("rope_theta", default_theta);
  std::string type = p.value("rope_type", p.value("type", std::string("default")));
  if (type == "linear") {
    r.scaling = RopeScaling::Linear;
    r.factor = p.value("factor", 1.f);
  } else if (type == "yarn" || type == "deepseek_yarn") {
    r.scaling = RopeScaling::Yarn;
    r.factor = p.value("factor", 1.f);
    r.original_max_positions = p.value("original_max_position_embeddings", int64_t(4096));
    auto num = [&](const char* k, float d) {
      return p.contains(k) && p[k].is_number() ? p[k].get<float>() : d;
    };
    r.beta_fast = num("beta_fast", 32.f);
    r.beta_slow = num("beta_slow", 1.f);
    r.mscale = num("mscale", 0.f);
    r.mscale_all_dim = num("mscale_all_dim", 0.f);
    r.truncate = p.value("truncate", true);
    auto get_mscale = [](double scale, double m) {
      return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    if (p.contains("attention_factor") && p["attention_factor"].is_number())
      r.attn_factor = p["attention_factor"].get<float>();
    else if (r.mscale != 0.f && r.mscale_all_dim != 0.f)
      r.attn_factor = float(get_mscale(r.factor, r.mscale) / get_mscale(r.factor, r.mscale_all_dim));
    else
      r.attn_factor = float(get_mscale(r.factor, 1.0));
  } else if (type == "llama3") {
    r.scaling = RopeScaling::Llama3;
    r.factor = p.value("factor", 8.f);
    r.low_freq_factor = p.value("low_freq_factor", 1.f);
    r.high_freq_factor = p.value("high_freq_factor", 4.f);
    r.original_max_positions = p.value("original_max_position_embeddings", int64_t(8192));
  }
  return r;
}

// DeepSeek-style routing (DeepSeek-V3, Kimi K2, GLM-4.5, GLM-5): sigmoid
// scores with a correction bias, expert groups, routed scaling, shared
// experts; the first k layers dense (then every moe_layer_freq-th sparse),
// unless mlp_layer_types lists each layer.
Result<void> deepseek_routing(const json& j, const std::string& path,
                              int64_t default_dense, ModelConfig& c) {
  c.n_experts = j.value("n_routed_experts", j.value("num_local_experts", int64_t(0)));
  c.moe_top_k = j.value("num_experts_per_tok", int64_t(0));
  c.moe_ffn = j.value("moe_intermediate_size", int64_t(0));
  c.moe_norm_topk = j.value("norm_topk_prob", true);
  const std::string scoring = j.value("scoring_func", std::string("sigmoid"));
  if (scoring != "sigmoid") return make_error(path + ": unsupported scoring_func '" + scoring + "'");
  c.moe_sigmoid = true;
  c.moe_n_group = j.value("n_group", int64_t(1));
  c.moe_topk_group = j.value("topk_group", int64_t(1));
  c.moe_scaling = j.value("routed_scaling_factor", 1.f);
  c.moe_shared_ffn = c.moe_ffn * j.value("n_shared_experts", int64_t(0));
  if (c.n_experts <= 0 || c.moe_top_k <= 0 || c.moe_top_k > c.n_experts || c.moe_ffn <= 0 ||
      c.moe_n_group <= 0 || c.n_experts % c.moe_n_group != 0 || c.moe_topk_group > c.moe_n_group)
    return make_error(path + ": inconsistent MoE routing settings");
  const int64_t dense = j.value("first_k_dense_replace", default_dense);
  const int64_t freq = std::max<int64_t>(1, j.value("moe_layer_freq", int64_t(1)));
  c.moe_layer.assign(size_t(c.layers), 0);
  for (int64_t i = dense; i < c.layers; ++i) c.moe_layer[size_t(i)] = i % freq == 0;
  if (j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array() &&
      int64_t(j["mlp_layer_types"].size()) == c.layers)
    for (int64_t i = 0; i < c.layers; ++i)
      c.moe_layer[size_t(i)] = j["mlp_layer_types"][size_t(i)] == "sparse";
  return {};
}

}  // namespace kvant::archs
