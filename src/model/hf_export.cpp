// GGUF -> Hugging Face names through the table the loader reads with
// (archs/tensor_names.h), so an exported tensor carries the name the loader
// looks for (quant_checkpoint_test loads both ways).
#include "model/hf_export.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/archs/arch.h"
#include "model/archs/tensor_names.h"

namespace kvant {

double short_float(float f) {
  char buf[32];
  for (int p = 6; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, double(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

namespace {

nlohmann::json rope_json(const RopeConfig& r) {
  if (r.scaling == RopeScaling::Linear) return {{"rope_type", "linear"}, {"factor", short_float(r.factor)}};
  if (r.scaling == RopeScaling::Llama3)
    return {{"rope_type", "llama3"},
            {"factor", short_float(r.factor)},
            {"low_freq_factor", short_float(r.low_freq_factor)},
            {"high_freq_factor", short_float(r.high_freq_factor)},
            {"original_max_position_embeddings", r.original_max_positions}};
  return nullptr;
}

}  // namespace

Result<GgufToHf> gguf_to_hf(const std::string& n, const ModelConfig& c) {
  const float norm_add = c.arch->hf_norm_plus_one ? -1.f : 0.f;
  if (const auto r = archs::tensor_role(archs::Naming::Gguf, n)) {
    const std::string hf = r->layer < 0 ? archs::global_tensor(archs::Naming::Hf, r->role)
                                        : archs::layer_tensor(archs::Naming::Hf, *c.arch, r->layer, r->role);
    if (!hf.empty()) {
      GgufToHf m{hf, 0, archs::role_is_norm(r->role) ? norm_add : 0.f};
      // GGUF Llama files store q/k rows permuted for interleaved RoPE.
      if (c.arch->gguf_qk_permuted && r->role == "wq") m.unpermute_heads = c.heads;
      if (c.arch->gguf_qk_permuted && r->role == "wk") m.unpermute_heads = c.kv_heads;
      return m;
    }
  }
  if (n == "rope_freqs.weight")
    return make_error("GGUF tensor rope_freqs.weight (Llama 3 RoPE scaling baked into a tensor) has no "
                      "Hugging Face equivalent kvant can write yet");
  return make_error("GGUF tensor " + n + " has no Hugging Face name kvant knows");
}

void unpermute_gguf_qk_rows(float* v, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> tmp(size_t(hd * cols));
  for (int64_t h = 0; h < heads; ++h) {
    float* base = v + h * hd * cols;
    for (int64_t r = 0; r < hd; ++r) {
      // GGUF row r = 2*i + j holds HF row j*(hd/2) + i.
      const int64_t i = r / 2, j = r % 2;
      const int64_t hf_row = j * (hd / 2) + i;
      std::copy(base + r * cols, base + (r + 1) * cols, tmp.begin() + hf_row * cols);
    }
    std::copy(tmp.begin(), tmp.end(), base);
  }
}

nlohmann::json hf_config_json(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.arch->hf_class};
  j["model_type"] = c.arch->hf_model_type;
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.ffn;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_positions;
  j["rms_norm_eps"] = short_float(c.rms_eps);
  j["rope_theta"] = short_float(c.rope.theta);
  j["rope_scaling"] = rope_json(c.rope);
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (c.bos_id >= 0) j["bos_token_id"] = c.bos_id;
  if (c.eos_id >= 0) j["eos_token_id"] = c.eos_id;
  j["torch_dtype"] = "bfloat16";
  if (c.arch->to_hf) {
    c.arch->to_hf(c, j);
  } else {
    j["hidden_act"] = "silu";
    j["attention_bias"] = c.qkv_bias;
  }
  return nlohmann::json::parse(j.dump());
}

}  // namespace kvant
