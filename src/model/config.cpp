// Parses architecture hyper-parameters. GGUF keys are "<arch>.<field>"; HF
// config.json fields vary by model family and transformers version (RoPE
// settings moved from rope_scaling/rope_theta to rope_parameters in v5).
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "model/archs/hf_config.h"
#include "model/archs/registry.h"

namespace kvant {

Result<void> ModelConfig::validate() const {
  auto bad = [&](const std::string& what) {
    return make_error("model config (" + arch_name + "): " + what);
  };
  if (vocab <= 0 || hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 ||
      ffn <= 0)
    return bad("vocab, hidden, layers, heads, kv_heads, head_dim and ffn must all be positive");
  if (heads % kv_heads != 0)
    return bad("heads (" + std::to_string(heads) + ") is not a multiple of kv_heads (" +
               std::to_string(kv_heads) + ")");
  if (head_dim % 2 != 0) return bad("head_dim must be even for RoPE");
  if (int64_t(sliding.size()) != layers) return bad("sliding-window layer list has the wrong length");
  if (mla()) {
    if (qk_nope_dim <= 0 || qk_rope_dim <= 0 || v_head_dim <= 0 || qk_rope_dim % 2 != 0 ||
        head_dim != qk_nope_dim + qk_rope_dim || kv_heads != heads || q_lora_rank < 0)
      return bad("inconsistent multi-head latent attention sizes (kv_lora_rank, qk_nope_head_dim, "
                 "qk_rope_head_dim, v_head_dim)");
  }
  return {};
}

namespace {

Result<int64_t> need_int(const GgufFile& g, const std::string& key) {
  auto v = g.get_int(key);
  if (!v) return make_error(g.path() + ": missing metadata " + key);
  return *v;
}

// The family's switches that hold whatever the file says.
void apply_flags(ModelConfig& c) {
  c.qkv_bias = c.arch->qkv_bias;
  c.qk_norm = c.arch->qk_norm;
  c.post_norms = c.arch->post_norms;
}

void finish_common(ModelConfig& c) {
  if (c.attn_scale == 0.f) c.attn_scale = 1.f / std::sqrt(float(c.head_dim));
  if (c.sliding.empty()) c.sliding.assign(size_t(c.layers), 0);
  if (c.rope_local.theta == 0.f) c.rope_local = c.rope;
}

}  // namespace

Result<ModelConfig> config_from_gguf(const GgufFile& g) {
  ModelConfig c;
  auto arch = g.get_string("general.architecture");
  if (!arch) return make_error(g.path() + ": missing metadata general.architecture");
  c.arch_name = *arch;
  const std::string a = *arch;
  c.arch = archs::arch_from_gguf(a);
  if (!c.arch)
    return make_error(g.path() + ": unsupported architecture '" + a + "' (kvant runs " +
                      archs::gguf_arch_list() + ")");

  auto get = [&](const std::string& k) { return need_int(g, a + "." + k); };
  auto r_hidden = get("embedding_length"); if (!r_hidden) return r_hidden.error();
  auto r_layers = get("block_count"); if (!r_layers) return r_layers.error();
  auto r_heads = get("attention.head_count"); if (!r_heads) return r_heads.error();
  auto r_ffn = get("feed_forward_length"); if (!r_ffn) return r_ffn.error();
  c.hidden = *r_hidden;
  c.layers = *r_layers;
  c.heads = *r_heads;
  c.ffn = *r_ffn;
  c.kv_heads = g.get_int(a + ".attention.head_count_kv").value_or(c.heads);
  c.head_dim = g.get_int(a + ".attention.key_length").value_or(c.heads ? c.hidden / c.heads : 0);
  c.max_positions = g.get_int(a + ".context_length").value_or(4096);
  c.rms_eps = float(g.get_number(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope.theta = float(g.get_number(a + ".rope.freq_base").value_or(10000.0));
  if (auto* toks = g.get_strings("tokenizer.ggml.tokens")) c.vocab = int64_t(toks->size());
  c.vocab = g.get_int(a + ".vocab_size").value_or(c.vocab);
  c.tie_embeddings = g.find_tensor("output.weight") == nullptr;
  c.bos_id = int32_t(g.get_int("tokenizer.ggml.bos_token_id").value_or(-1));
  c.eos_id = int32_t(g.get_int("tokenizer.ggml.eos_token_id").value_or(-1));
  if (auto st = g.get_string(a + ".rope.scaling.type")) {
    if (*st == "linear") {
      c.rope.scaling = RopeScaling::Linear;
      c.rope.factor = float(g.get_number(a + ".rope.scaling.factor").value_or(1.0));
    }
  }
  // Llama 3 scaling arrives baked into a rope_freqs tensor; the loader applies it.
  c.rope_local = c.rope;

  apply_flags(c);
  if (c.arch->from_gguf) c.arch->from_gguf(g, a, c);
  finish_common(c);
  KV_TRY(c.validate());
  return c;
}

Result<ModelConfig> config_from_hf_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error(path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    return make_error(path + ": invalid JSON: " + e.what());
  }
  return config_from_hf(j, path);
}

Result<ModelConfig> config_from_hf(const nlohmann::json& j, const std::string& path) {
  ModelConfig c;
  std::string arch_str = j.contains("architectures") && j["architectures"].is_array() &&
                              !j["architectures"].empty()
                          ? j["architectures"][0].get<std::string>()
                          : j.value("model_type", std::string());
  c.arch_name = arch_str;
  c.arch = archs::arch_from_hf(arch_str);
  if (!c.arch)
    return make_error(path + ": unsupported architecture '" + arch_str + "' (kvant runs " +
                      archs::hf_arch_list() + ")");

  try {
    c.vocab = j.at("vocab_size");
    c.hidden = j.at("hidden_size");
    c.layers = j.at("num_hidden_layers");
    c.heads = j.at("num_attention_heads");
    c.ffn = j.at("intermediate_size");
  } catch (const std::exception& e) {
    return make_error(path + ": missing or mistyped field: " + e.what());
  }
  c.kv_heads = j.value("num_key_value_heads", c.heads);
  c.head_dim = j.contains("head_dim") && j["head_dim"].is_number() ? j["head_dim"].get<int64_t>()
                                                                  : c.hidden / c.heads;
  c.max_positions = j.value("max_position_embeddings", int64_t(4096));
  if (j.contains("num_nextn_predict_layers") && j["num_nextn_predict_layers"].is_number_integer())
    c.nextn_layers = std::max<int64_t>(0, j["num_nextn_predict_layers"].get<int64_t>());
  c.rms_eps = j.value("rms_norm_eps", 1e-6f);
  c.tie_embeddings = j.value("tie_word_embeddings", c.arch->hf_tie_default);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number()) c.bos_id = j["bos_token_id"];
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number()) c.eos_id = j["eos_token_id"];
  float theta = j.value("rope_theta", 10000.f);

  nlohmann::json rp = j.contains("rope_parameters") && j["rope_parameters"].is_object()
                          ? j["rope_parameters"]
                          : nlohmann::json::object();
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
    for (auto& [k, v] : j["rope_scaling"].items()) rp[k] = v;

  c.rope = archs::rope_from_json(rp, theta);
  c.rope_local = c.rope;
  apply_flags(c);
  if (c.arch->from_hf) KV_TRY(c.arch->from_hf(archs::HfInput{j, rp, theta, path}, c));
  // A family that sets no activation of its own runs SiLU.
  if (c.act == Activation::Silu) {
    std::string act = j.value("hidden_act", std::string("silu"));
    if (act != "silu") return make_error(path + ": unsupported hidden_act '" + act + "'");
  }
  finish_common(c);
  KV_TRY(c.validate());
  return c;
}

}  // namespace kvant
