// Gemma 3 (Gemma3ForCausalLM; GGUF "gemma3"): QK-norm, norms after attention
// and the MLP, GELU (tanh), embeddings scaled by sqrt(hidden), soft-capping,
// and sliding-window layers with their own RoPE base between global ones.
// Hugging Face norm weights hold w for a forward of x*(1+w) (GGUF: 1+w).
#include <cmath>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/archs/hf_config.h"
#include "model/hf_export.h"

namespace kvant::archs {
namespace {

void gemma3_common(ModelConfig& c) {
  c.act = Activation::GeluTanh;
  c.embed_scale = std::sqrt(float(c.hidden));
}

Result<void> gemma3_from_hf(const HfInput& in, ModelConfig& c) {
  const json& j = in.j;
  const json& rp = in.rope;
  gemma3_common(c);
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
    c.rope = rope_from_json(rp, in.theta);
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

void gemma3_from_gguf(const GgufFile& g, const std::string& a, ModelConfig& c) {
  gemma3_common(c);
  c.sliding_window = g.get_int(a + ".attention.sliding_window").value_or(0);
  c.rope_local = RopeConfig{};
  c.rope_local.theta = 10000.f;
  // Gemma 3 GGUFs carry no layer-type list: every sixth layer is global.
  c.sliding.resize(size_t(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) c.sliding[size_t(i)] = (i + 1) % 6 != 0;
  // query_pre_attn_scalar equals head_dim for the released Gemma 3 sizes.
  c.attn_scale = 1.f / std::sqrt(float(c.head_dim));
  c.final_softcap = float(g.get_number(a + ".final_logit_softcapping").value_or(0.0));
  c.attn_softcap = float(g.get_number(a + ".attn_logit_softcapping").value_or(0.0));
}

void gemma3_to_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["hidden_act"] = "gelu_pytorch_tanh";
  j["query_pre_attn_scalar"] = short_float(1.f / (c.attn_scale * c.attn_scale));
  j["sliding_window"] = c.sliding_window;
  j["rope_local_base_freq"] = short_float(c.rope_local.theta);
  std::vector<std::string> types;
  for (auto s : c.sliding) types.push_back(s ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["final_logit_softcapping"] =
      c.final_softcap > 0 ? nlohmann::json(short_float(c.final_softcap)) : nlohmann::json();
  j["attn_logit_softcapping"] =
      c.attn_softcap > 0 ? nlohmann::json(short_float(c.attn_softcap)) : nlohmann::json();
}

}  // namespace

extern const ArchSpec kGemma3{
    .name = "gemma3",
    .gguf_names = {"gemma3"},
    .hf_classes = {"Gemma3ForCausalLM"},
    .hf_class = "Gemma3ForCausalLM",
    .hf_model_type = "gemma3_text",
    .qk_norm = true,
    .post_norms = true,
    .hf_tie_default = true,
    .hf_norm_plus_one = true,
    .hf_role_names = {{{"ffn_norm", "pre_feedforward_layernorm.weight"},
                       {"post_attn_norm", "post_attention_layernorm.weight"},
                       {"post_ffn_norm", "post_feedforward_layernorm.weight"}}},
    .from_hf = gemma3_from_hf,
    .from_gguf = gemma3_from_gguf,
    .to_hf = gemma3_to_hf,
};

}  // namespace kvant::archs
