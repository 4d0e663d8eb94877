// Parses architecture hyper-parameters. GGUF keys are "<arch>.<field>"; HF
// config.json fields vary by model family and transformers version (RoPE
// settings moved from rope_scaling/rope_theta to rope_parameters in v5).
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/gguf.h"

namespace kvant {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Gemma3: return "gemma3";
    case Arch::Glm4Moe: return "glm4_moe";
    case Arch::DeepseekV3: return "deepseek_v3";
    case Arch::GlmMoeDsa: return "glm_moe_dsa";
  }
  return "?";
}

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
  if (a == "llama") c.arch = Arch::Llama;
  else if (a == "qwen2") c.arch = Arch::Qwen2;
  else if (a == "qwen3") c.arch = Arch::Qwen3;
  else if (a == "gemma3") c.arch = Arch::Gemma3;
  else return make_error(g.path() + ": unsupported architecture '" + a + "' (kvant runs llama, qwen2, qwen3, gemma3)");

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

  switch (c.arch) {
    case Arch::Llama: break;
    case Arch::Qwen2: c.qkv_bias = true; break;
    case Arch::Qwen3: c.qk_norm = true; break;
    case Arch::Glm4Moe:
    case Arch::DeepseekV3:
    case Arch::GlmMoeDsa: break;  // not read from GGUF
    case Arch::Gemma3: {
      c.qk_norm = true;
      c.post_norms = true;
      c.act = Activation::GeluTanh;
      c.embed_scale = std::sqrt(float(c.hidden));
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
      break;
    }
  }
  finish_common(c);
  KV_TRY(c.validate());
  return c;
}

namespace {

RopeConfig rope_from_json(const nlohmann::json& p, float default_theta) {
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
Result<void> deepseek_routing(const nlohmann::json& j, const std::string& path,
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

}  // namespace

Result<ModelConfig> config_from_hf_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) return make_error(path + ": cannot open");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    return make_error(path + ": invalid JSON: " + e.what());
  }
  ModelConfig c;
  std::string archs = j.contains("architectures") && j["architectures"].is_array() &&
                              !j["architectures"].empty()
                          ? j["architectures"][0].get<std::string>()
                          : j.value("model_type", std::string());
  c.arch_name = archs;
  if (archs == "LlamaForCausalLM" || archs == "MistralForCausalLM") c.arch = Arch::Llama;
  else if (archs == "Qwen2ForCausalLM") c.arch = Arch::Qwen2;
  else if (archs == "Qwen3ForCausalLM" || archs == "Qwen3MoeForCausalLM") c.arch = Arch::Qwen3;
  else if (archs == "Gemma3ForCausalLM") c.arch = Arch::Gemma3;
  else if (archs == "Glm4MoeForCausalLM") c.arch = Arch::Glm4Moe;
  else if (archs == "DeepseekV3ForCausalLM") c.arch = Arch::DeepseekV3;
  else if (archs == "GlmMoeDsaForCausalLM") c.arch = Arch::GlmMoeDsa;
  else return make_error(path + ": unsupported architecture '" + archs + "'");

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
  c.rms_eps = j.value("rms_norm_eps", 1e-6f);
  c.tie_embeddings = j.value("tie_word_embeddings", c.arch == Arch::Gemma3);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number()) c.bos_id = j["bos_token_id"];
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number()) c.eos_id = j["eos_token_id"];
  float theta = j.value("rope_theta", 10000.f);

  nlohmann::json rp = j.contains("rope_parameters") && j["rope_parameters"].is_object()
                          ? j["rope_parameters"]
                          : nlohmann::json::object();
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
    for (auto& [k, v] : j["rope_scaling"].items()) rp[k] = v;

  if (c.arch == Arch::Gemma3) {
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
      c.rope_local = rope_from_json(rp.value("sliding_attention", nlohmann::json::object()), 10000.f);
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
  } else {
    c.rope = rope_from_json(rp, theta);
    c.rope_local = c.rope;
    if (c.arch == Arch::Qwen2) c.qkv_bias = true;
    if (c.arch == Arch::Llama) c.qkv_bias = j.value("attention_bias", false);
    if (c.arch == Arch::Qwen3) {
      c.qk_norm = true;
      c.qkv_bias = j.value("attention_bias", false);
    }
    if (c.arch == Arch::DeepseekV3 || c.arch == Arch::GlmMoeDsa) {
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
      c.rope_interleave = c.arch == Arch::GlmMoeDsa || j.value("rope_interleave", true);
      c.attn_scale = 1.f / std::sqrt(float(c.head_dim));
      if (c.rope.scaling == RopeScaling::Yarn && c.rope.mscale_all_dim != 0.f && c.rope.factor > 1.f) {
        const float m = 0.1f * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.f;
        c.attn_scale *= m * m;
      }
      if (c.arch == Arch::GlmMoeDsa) {
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
    }
    if (c.arch == Arch::Glm4Moe) {
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
    }
    if (archs == "Qwen3MoeForCausalLM") {
      // Softmax top-k routing; layer i is sparse unless listed in
      // mlp_only_layers, and then only every decoder_sparse_step-th.
      // transformers 5 writes num_local_experts, earlier versions num_experts.
      c.n_experts = j.value("num_experts", j.value("num_local_experts", int64_t(0)));
      c.moe_top_k = j.value("num_experts_per_tok", int64_t(0));
      c.moe_ffn = j.value("moe_intermediate_size", int64_t(0));
      c.moe_norm_topk = j.value("norm_topk_prob", false);
      if (c.n_experts <= 0 || c.moe_top_k <= 0 || c.moe_top_k > c.n_experts || c.moe_ffn <= 0)
        return make_error(path + ": Qwen3-MoE needs num_experts, num_experts_per_tok <= num_experts "
                                 "and moe_intermediate_size");
      const int64_t step = std::max<int64_t>(1, j.value("decoder_sparse_step", int64_t(1)));
      std::vector<int64_t> dense_only;
      if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
        dense_only = j["mlp_only_layers"].get<std::vector<int64_t>>();
      c.moe_layer.assign(size_t(c.layers), 0);
      for (int64_t i = 0; i < c.layers; ++i)
        c.moe_layer[size_t(i)] =
            std::find(dense_only.begin(), dense_only.end(), i) == dense_only.end() && (i + 1) % step == 0;
    }
    std::string act = j.value("hidden_act", std::string("silu"));
    if (act != "silu") return make_error(path + ": unsupported hidden_act '" + act + "'");
  }
  finish_common(c);
  KV_TRY(c.validate());
  return c;
}

}  // namespace kvant
