// Gemma 3 (Gemma3ForCausalLM): QK-norm, norms after attention and the MLP,
// GELU (tanh), embeddings scaled by sqrt(hidden), soft-capping, and
// sliding-window layers with their own RoPE base between global ones.
#include <cmath>

#include "model/archs/hf_config.h"

namespace kvant::archs {

Result<void> gemma3_from_hf(const json& j, const json& rp, float theta, ModelConfig& c) {
  c.qk_norm = true;
  c.post_norms = true;
  c.act = Activation::GeluTanh;
  c.embed_scale = std::sqrt(float(c.hidden));
  c.attn_scale = 1.f / std::sqrt(j.value("query_pre_attn_scalar", float(c.head_dim)));
  c.sliding_window = j.value("sliding_window", int64_t(0));
  if (j.contains("final_logit_softcapping") && j["final_logit_softcapping"].is_number())
    c.final_softcap = j["final_logit_softcapping"];
  if (j.contains("attn_logit_softcapping") && j["attn_logit_softcapping"].is_number())
    c.attn_softcap = j["attn_logit_softcapping"];
  if (rp.contains("full_attention")) {
    c.rope = rope_from_json(rp["full_attention"], 1000000.f);
    c.rope_local = rope_from_json(rp.value("sliding_attention", json::object()), 10000.f);
  } else {
    c.rope = rope_from_json(rp, theta);
    c.rope_local = RopeConfig{};
    c.rope_local.theta = j.value("rope_local_base_freq", 10000.f);
  }
  c.sliding.resize(size_t(c.layers));
  if (j.contains("layer_types") && j["layer_types"].is_array() &&
      int64_t(j["layer_types"].size()) == c.layers) {
    for (int64_t i = 0; i < c.layers; ++i)
      c.sliding[size_t(i)] = j["layer_types"][size_t(i)] == "sliding_attention";
  } else {
    int64_t pat = j.value("sliding_window_pattern", j.value("_sliding_window_pattern", int64_t(6)));
    for (int64_t i = 0; i < c.layers; ++i) c.sliding[size_t(i)] = (i + 1) % pat != 0;
  }
  return {};
}

}  // namespace kvant::archs
