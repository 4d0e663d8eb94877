// Weight sizes from a config.json (see weight_plan.h).
#include "engine/weight_plan.h"

#include <cmath>
#include <regex>

namespace kvant {
namespace {

using json = nlohmann::json;

// Fields are read from a nested text_config first (multimodal wrappers).
struct Fields {
  const json& top;
  const json* text = nullptr;
  explicit Fields(const json& j) : top(j) {
    if (j.contains("text_config") && j["text_config"].is_object()) text = &j["text_config"];
  }
  const json* find(const char* k) const {
    if (text && text->contains(k) && !(*text)[k].is_null()) return &(*text)[k];
    if (top.contains(k) && !top[k].is_null()) return &top[k];
    return nullptr;
  }
  int64_t num(const char* k, int64_t dflt) const {
    const json* v = find(k);
    return v && v->is_number() ? v->get<int64_t>() : dflt;
  }
  Result<int64_t> need(const char* k) const {
    const json* v = find(k);
    if (!v || !v->is_number_integer() || v->get<int64_t>() <= 0)
      return make_error(std::string("config.json: missing or non-positive field '") + k + "'");
    return v->get<int64_t>();
  }
};

// Does a module name match a compressed-tensors ignore entry ("re:" regex
// or an exact name) or an FP8 modules_to_not_convert entry (a name part)?
bool matches(const std::string& module, const json& list, bool substring) {
  if (!list.is_array()) return false;
  for (const auto& e : list) {
    if (!e.is_string()) continue;
    const std::string p = e.get<std::string>();
    if (p.rfind("re:", 0) == 0) {
      try {
        if (std::regex_match(module, std::regex(p.substr(3)))) return true;
      } catch (const std::regex_error&) {
      }
    } else if (substring ? module.find(p) != std::string::npos : module == p) {
      return true;
    }
  }
  return false;
}

// Appends a group of `count` [rows, cols] tensors, unless it is empty.
void add_group(std::vector<WeightGroup>& groups, std::string name, std::string module, int64_t rows,
               int64_t cols, int64_t count, bool linear, bool expert = false, bool is_mtp = false) {
  if (count > 0 && rows > 0 && cols > 0)
    groups.push_back(
        {std::move(name), std::move(module), rows, cols, count, linear, expert, is_mtp});
}

// The config's sizes a decoder layer's tensors depend on.
struct LayerDims {
  int64_t hidden = 0, heads = 0;
  int64_t ffn = 0;                   // dense MLP
  int64_t experts = 0, moe_ffn = 0;  // routed experts
  int64_t shared = 0;                // shared experts
  int64_t kv_lora = 0;               // MLA when > 0
};

// One decoder layer's tensors, `n` times (layers idx, idx + 1, ...): GQA or
// MLA attention (with GLM-5's indexer), then a dense or an MoE MLP.
void add_layer_groups(std::vector<WeightGroup>& groups, const Fields& c, const LayerDims& d,
                      int64_t n, bool moe, bool is_mtp, int64_t idx) {
  const int64_t H = d.hidden, NH = d.heads, E = d.experts, moe_ffn = d.moe_ffn;
  const std::string pre = "model.layers." + std::to_string(idx) + ".";
  auto add = [&](std::string name, std::string module, int64_t rows, int64_t cols, int64_t count,
                 bool linear, bool expert = false) {
    add_group(groups, std::move(name), std::move(module), rows, cols, count, linear, expert,
              is_mtp);
  };
  add("layer norms", pre + "input_layernorm", H, 1, 2 * n, false);
  if (d.kv_lora > 0) {
    const int64_t qlora = c.num("q_lora_rank", 0), nope = c.num("qk_nope_head_dim", 128),
                  rope = c.num("qk_rope_head_dim", 64), vd = c.num("v_head_dim", 128);
    const int64_t qk = nope + rope;
    if (qlora > 0) {
      add("attn q_a_proj", pre + "self_attn.q_a_proj", qlora, H, n, true);
      add("attn q_b_proj", pre + "self_attn.q_b_proj", NH * qk, qlora, n, true);
      add("attn q_a_layernorm", pre + "self_attn.q_a_layernorm", qlora, 1, n, false);
    } else {
      add("attn q_proj", pre + "self_attn.q_proj", NH * qk, H, n, true);
    }
    add("attn kv_a_proj_with_mqa", pre + "self_attn.kv_a_proj_with_mqa", d.kv_lora + rope, H, n,
        true);
    add("attn kv_a_layernorm", pre + "self_attn.kv_a_layernorm", d.kv_lora, 1, n, false);
    add("attn kv_b_proj", pre + "self_attn.kv_b_proj", NH * (nope + vd), d.kv_lora, n, true);
    add("attn o_proj", pre + "self_attn.o_proj", H, NH * vd, n, true);
    const int64_t ih = c.num("index_n_heads", 0), ihd = c.num("index_head_dim", 0);
    if (ih > 0 && ihd > 0 && qlora > 0) {
      add("indexer wq_b", pre + "self_attn.indexer.wq_b", ih * ihd, qlora, n, true);
      add("indexer wk", pre + "self_attn.indexer.wk", ihd, H, n, true);
      add("indexer weights_proj", pre + "self_attn.indexer.weights_proj", ih, H, n, true);
      add("indexer k_norm", pre + "self_attn.indexer.k_norm", ihd, 2, n, false);
    }
  } else {
    const int64_t kvh = c.num("num_key_value_heads", NH);
    const int64_t hd = c.num("head_dim", H / NH);
    add("attn q_proj", pre + "self_attn.q_proj", NH * hd, H, n, true);
    add("attn k_proj+v_proj", pre + "self_attn.k_proj", kvh * hd, H, 2 * n, true);
    add("attn o_proj", pre + "self_attn.o_proj", H, NH * hd, n, true);
  }
  if (!moe) {
    add("dense mlp gate+up", pre + "mlp.gate_proj", d.ffn, H, 2 * n, true);
    add("dense mlp down", pre + "mlp.down_proj", H, d.ffn, n, true);
    return;
  }
  add("router", pre + "mlp.gate", E, H, n, false);
  add("router bias", pre + "mlp.gate.e_score_correction_bias", E, 1, n, false);
  add("routed experts gate+up", pre + "mlp.experts.0.gate_proj", moe_ffn, H, 2 * E * n, true, true);
  add("routed experts down", pre + "mlp.experts.0.down_proj", H, moe_ffn, E * n, true, true);
  if (d.shared > 0) {
    add("shared experts gate+up", pre + "mlp.shared_experts.gate_proj", d.shared * moe_ffn, H,
        2 * n, true);
    add("shared experts down", pre + "mlp.shared_experts.down_proj", H, d.shared * moe_ffn, n,
        true);
  }
}

// A policy that stores each group in the format `pick` chooses for it.
template <class Pick>
WeightPolicy make_policy(const std::vector<WeightGroup>& groups, std::string name, std::string desc,
                         Pick pick) {
  WeightPolicy pol;
  pol.name = std::move(name);
  pol.description = std::move(desc);
  for (const auto& g : groups) pol.formats.push_back(pick(g));
  return pol;
}

// The bytes of every group under a policy: in all, without MTP layers, and
// of the routed experts alone.
WeightPolicyBytes policy_bytes(const std::vector<WeightGroup>& groups, const WeightPolicy& pol) {
  WeightPolicyBytes b{pol.name, pol.description, 0, 0, 0};
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    const double x = double(g.count) * weight_tensor_bytes(pol.formats[i], g.rows, g.cols,
                                                           pol.int4_group, pol.fp8_block);
    b.bytes += x;
    if (!g.mtp) b.bytes_no_mtp += x;
    if (g.expert && !g.mtp) b.expert_bytes += x;
  }
  return b;
}

// The checkpoint's own policy, from its quantization_config: FP8 blocks,
// compressed-tensors INT4 or FP8 with its ignore list, or BF16 when there is
// none.
// Any other quant_method is an error.
Result<WeightPolicy> native_policy(const json& config, const Fields& c,
                                   const std::vector<WeightGroup>& groups) {
  const json* q = c.find("quantization_config");
  if (!q && config.contains("quantization_config")) q = &config["quantization_config"];
  WeightPolicy native;
  if (q && q->is_object() && q->value("quant_method", std::string()) == "fp8") {
    int64_t blk = 128;
    if (q->contains("weight_block_size") && (*q)["weight_block_size"].is_array() &&
        !(*q)["weight_block_size"].empty())
      blk = (*q)["weight_block_size"][0].get<int64_t>();
    const json none = json::array();
    const json& skip =
        q->contains("modules_to_not_convert") ? (*q)["modules_to_not_convert"] : none;
    native = make_policy(groups, "native",
                         "FP8 e4m3 " + std::to_string(blk) + "x" + std::to_string(blk) +
                             " blocks (the checkpoint's quantization_config); the rest BF16",
                         [&](const WeightGroup& g) {
                           return g.linear && !matches(g.module, skip, true)
                                      ? WeightFormat::kFp8Block
                                      : WeightFormat::kBf16;
                         });
    native.fp8_block = blk;
  } else if (q && q->is_object() &&
             q->value("quant_method", std::string()) == "compressed-tensors") {
    int group = 32;
    bool int4 = false, fp8 = false;
    if (q->contains("config_groups") && (*q)["config_groups"].is_object())
      for (const auto& [k, grp] : (*q)["config_groups"].items()) {
        if (!grp.contains("weights") || !grp["weights"].is_object()) continue;
        const json& w = grp["weights"];
        if (w.value("num_bits", 0) == 4) {
          int4 = true;
          group = w.contains("group_size") && w["group_size"].is_number_integer()
                      ? w["group_size"].get<int>()
                      : 32;
        } else if (w.value("num_bits", 0) == 8 && w.value("type", std::string()) == "float") {
          fp8 = true;
        }
      }
    const json none = json::array();
    const json& ignore = q->contains("ignore") ? (*q)["ignore"] : none;
    if (fp8 && !int4) {
      // float-quantized: e4m3 codes; scales per block, channel or tensor
      // (sized here as 128x128 blocks, within a fraction of a percent).
      native = make_policy(groups, "native",
                           "compressed-tensors FP8 e4m3 where the ignore list allows (the "
                           "checkpoint's quantization_config); the rest BF16",
                           [&](const WeightGroup& g) {
                             return g.linear && !matches(g.module, ignore, false)
                                        ? WeightFormat::kFp8Block
                                        : WeightFormat::kBf16;
                           });
      return native;
    }
    if (!int4)
      return make_error("config.json: compressed-tensors config without 4-bit int or 8-bit float weights");
    native = make_policy(groups, "native",
                         "compressed-tensors INT4 group " + std::to_string(group) +
                             " where the ignore list allows (the checkpoint's "
                             "quantization_config); the rest BF16",
                         [&](const WeightGroup& g) {
                           return g.linear && !matches(g.module, ignore, false)
                                      ? WeightFormat::kInt4
                                      : WeightFormat::kBf16;
                         });
    native.int4_group = group;
  } else if (q && q->is_object()) {
    return make_error("config.json: unsupported quantization_config quant_method '" +
                      q->value("quant_method", std::string("?")) + "'");
  } else {
    native = make_policy(groups, "native", "BF16 (no quantization_config)",
                         [](const WeightGroup&) { return WeightFormat::kBf16; });
  }
  return native;
}

// The bytes under every policy kvant plan reports: the native one first,
// then all BF16, all linears FP8, and INT4 (routed experts alone when the
// model has them, with a variant that also stores the other linears FP8).
void add_policy_bytes(WeightPlan& p, const WeightPolicy& native, int64_t experts) {
  const auto& groups = p.groups;
  p.policies.push_back(policy_bytes(groups, native));
  p.policies.push_back(
      policy_bytes(groups, make_policy(groups, "bf16", "every tensor BF16",
                                       [](const WeightGroup&) { return WeightFormat::kBf16; })));
  p.policies.push_back(policy_bytes(
      groups, make_policy(groups, "fp8",
                          "every linear projection FP8 e4m3 (128x128 blocks, FP32 scales); "
                          "embeddings, lm_head, routers, norms BF16",
                          [](const WeightGroup& g) {
                            return g.linear ? WeightFormat::kFp8Block : WeightFormat::kBf16;
                          })));
  if (experts > 0) {
    p.policies.push_back(policy_bytes(
        groups, make_policy(groups, "int4",
                            "routed experts INT4 W4A16 group 32 (BF16 scales); the rest BF16",
                            [](const WeightGroup& g) {
                              return g.expert ? WeightFormat::kInt4 : WeightFormat::kBf16;
                            })));
    p.policies.push_back(policy_bytes(
        groups, make_policy(groups, "int4+fp8",
                            "routed experts INT4 group 32; other linear projections FP8 blocks; "
                            "the rest BF16",
                            [](const WeightGroup& g) {
                              return g.expert   ? WeightFormat::kInt4
                                     : g.linear ? WeightFormat::kFp8Block
                                                : WeightFormat::kBf16;
                            })));
  } else {
    p.policies.push_back(policy_bytes(
        groups,
        make_policy(groups, "int4", "every linear projection INT4 W4A16 group 32; the rest BF16",
                    [](const WeightGroup& g) {
                      return g.linear ? WeightFormat::kInt4 : WeightFormat::kBf16;
                    })));
  }
}

}  // namespace

double weight_tensor_bytes(WeightFormat f, int64_t rows, int64_t cols, int int4_group,
                           int64_t fp8_block) {
  const double n = double(rows) * double(cols);
  switch (f) {
    case WeightFormat::kBf16: return 2 * n;
    case WeightFormat::kFp8Block: {
      const double tiles = double((rows + fp8_block - 1) / fp8_block) *
                           double((cols + fp8_block - 1) / fp8_block);
      return n + 4 * tiles;
    }
    case WeightFormat::kInt4:
      return n / 2 + 2.0 * double(rows) * double((cols + int4_group - 1) / int4_group);
  }
  return 0;
}

Result<WeightPlan> weight_plan_from_config(const json& config) {
  if (!config.is_object()) return make_error("config.json: expected a JSON object");
  Fields c(config);
  WeightPlan p;
  if (config.contains("architectures") && config["architectures"].is_array() &&
      !config["architectures"].empty())
    p.architecture = config["architectures"][0].get<std::string>();
  auto vocab = c.need("vocab_size");
  auto hidden = c.need("hidden_size");
  auto layers = c.need("num_hidden_layers");
  auto heads = c.need("num_attention_heads");
  if (!vocab) return vocab.error();
  if (!hidden) return hidden.error();
  if (!layers) return layers.error();
  if (!heads) return heads.error();
  const int64_t V = *vocab, H = *hidden, L = *layers, NH = *heads;
  const int64_t ffn = c.num("intermediate_size", 0);
  const int64_t E = c.num("n_routed_experts", c.num("num_experts", c.num("num_local_experts", 0)));
  const int64_t moe_ffn = c.num("moe_intermediate_size", 0);
  const int64_t shared = c.num("n_shared_experts", 0);
  const int64_t top_k = c.num("num_experts_per_tok", 0);
  const int64_t dense_first = E > 0 ? c.num("first_k_dense_replace", 0) : L;
  const int64_t mtp = c.num("num_nextn_predict_layers", 0);
  const int64_t kv_lora = c.num("kv_lora_rank", 0);
  bool tied = false;
  if (const json* t = c.find("tie_word_embeddings"); t && t->is_boolean()) tied = t->get<bool>();
  if (config.contains("tie_word_embeddings") && config["tie_word_embeddings"].is_boolean())
    tied = config["tie_word_embeddings"].get<bool>();
  if (E > 0 && (moe_ffn <= 0 || top_k <= 0))
    return make_error(
        "config.json: routed experts need moe_intermediate_size and num_experts_per_tok");

  add_group(p.groups, "embed_tokens", "model.embed_tokens", V, H, 1, false);
  if (!tied) add_group(p.groups, "lm_head", "lm_head", V, H, 1, false);
  add_group(p.groups, "final norm", "model.norm", H, 1, 1, false);

  const LayerDims d{.hidden = H,
                    .heads = NH,
                    .ffn = ffn,
                    .experts = E,
                    .moe_ffn = moe_ffn,
                    .shared = shared,
                    .kv_lora = kv_lora};
  const int64_t n_dense = std::min(dense_first, L);
  if (n_dense > 0) add_layer_groups(p.groups, c, d, n_dense, false, false, 0);
  if (L - n_dense > 0) add_layer_groups(p.groups, c, d, L - n_dense, true, false, n_dense);
  if (mtp > 0) {
    add_layer_groups(p.groups, c, d, mtp, E > 0, true, L);
    add_group(p.groups, "mtp eh_proj", "model.layers." + std::to_string(L) + ".eh_proj", H, 2 * H,
              mtp, true, false, true);
    add_group(p.groups, "mtp norms", "model.layers." + std::to_string(L) + ".enorm", H, 1, 3 * mtp,
              false, false, true);
    p.notes.push_back(std::to_string(mtp) +
                      " multi-token-prediction layer(s) are in the checkpoint total and left out "
                      "of the serving total (--mtp serves the first)");
  }
  if (config.contains("vision_config"))
    p.notes.push_back("the vision encoder (vision_config) is not counted");

  for (const auto& g : p.groups) {
    p.params += g.params();
    if (!g.mtp) p.params_no_mtp += g.params();
    if (g.expert && !g.mtp) p.expert_params += g.params();
  }
  // Active per token: everything but the routed experts, plus top_k of them.
  p.active_params = p.params_no_mtp - p.expert_params -
                    (tied ? 0 : V * H) /* the output head runs once; embeddings are a lookup */ +
                    (E > 0 ? p.expert_params / E * top_k : 0);

  // Precision policies.
  auto native = native_policy(config, c, p.groups);
  if (!native) return native.error();
  add_policy_bytes(p, *native, E);
  return p;
}

json weight_plan_to_json(const WeightPlan& p) {
  json j;
  j["params"] = p.params;
  j["params_without_mtp"] = p.params_no_mtp;
  j["routed_expert_params"] = p.expert_params;
  j["active_params_per_token"] = p.active_params;
  json pols = json::array();
  for (const auto& b : p.policies)
    pols.push_back({{"precision", b.name}, {"description", b.description}, {"bytes", b.bytes},
                    {"bytes_without_mtp", b.bytes_no_mtp}, {"routed_expert_bytes", b.expert_bytes}});
  j["precisions"] = std::move(pols);
  json groups = json::array();
  for (const auto& g : p.groups)
    groups.push_back({{"name", g.name}, {"rows", g.rows}, {"cols", g.cols}, {"count", g.count},
                      {"params", g.params()}, {"mtp", g.mtp}});
  j["groups"] = std::move(groups);
  j["notes"] = p.notes;
  return j;
}

}  // namespace kvant
