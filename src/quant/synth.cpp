// Synthetic checkpoints (see synth.h).
#include "quant/synth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/json_text.h"
#include "io/safetensors_writer.h"
#include "numerics/bf16.h"

namespace kvant {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

int64_t round_to(double x, int64_t multiple, int64_t lo) {
  const int64_t r = int64_t(std::llround(x / double(multiple))) * multiple;
  return std::max(r, lo);
}

}  // namespace

Result<json> synth_config(const json& like, double f, int64_t vocab_override) {
  if (!like.is_object()) return make_error("synth: config is not a JSON object");
  if (!(f > 0 && f <= 1)) return make_error("synth: --scale must be in (0, 1]");
  // Multimodal wrappers: the text decoder's fields, flattened.
  json c = like.contains("text_config") && like["text_config"].is_object() ? like["text_config"] : like;
  if (!c.contains("architectures") && like.contains("architectures")) c["architectures"] = like["architectures"];
  std::string arch = c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty()
                         ? c["architectures"][0].get<std::string>()
                         : "";
  if (arch == "KimiK25ForConditionalGeneration" || arch.empty()) arch = "DeepseekV3ForCausalLM";
  c["architectures"] = json::array({arch});
  for (const char* k : {"quantization_config", "mlp_layer_types", "indexer_types", "layer_types",
                        "auto_map", "vision_config", "text_config"})
    c.erase(k);
  auto num = [&](const char* k) -> int64_t {
    return c.contains(k) && c[k].is_number() ? c[k].get<int64_t>() : 0;
  };
  for (const char* k : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"})
    if (num(k) <= 0) return make_error(std::string("synth: config has no positive '") + k + "'");
  // Widths: multiples of 32 (the INT4 kernels' block).
  for (const char* k : {"hidden_size", "intermediate_size", "moe_intermediate_size", "q_lora_rank",
                        "kv_lora_rank"})
    if (num(k) > 0) c[k] = round_to(double(num(k)) * f, 32, 32);
  // Head sizes: multiples of 8 (RoPE needs even).
  for (const char* k : {"qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_head_dim"})
    if (num(k) > 0) c[k] = round_to(double(num(k)) * f, 8, 8);
  if (num("kv_lora_rank") > 0) {
    c["head_dim"] = num("qk_rope_head_dim");
  } else if (num("head_dim") > 0) {
    c["head_dim"] = round_to(double(num("head_dim")) * f, 16, 16);
  }
  const int64_t heads = std::max<int64_t>(1, std::llround(double(num("num_attention_heads")) * f));
  int64_t kvh = num("num_key_value_heads") > 0
                    ? std::max<int64_t>(1, std::llround(double(num("num_key_value_heads")) * f))
                    : heads;
  while (heads % kvh != 0) --kvh;
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = num("kv_lora_rank") > 0 ? heads : kvh;
  if (num("index_n_heads") > 0) c["index_n_heads"] = std::max<int64_t>(1, std::llround(double(num("index_n_heads")) * f));
  const int64_t layers = std::max<int64_t>(2, std::llround(double(num("num_hidden_layers")) * f));
  const int64_t dense = num("first_k_dense_replace");
  c["num_hidden_layers"] = layers;
  if (dense > 0) c["first_k_dense_replace"] = std::min<int64_t>(layers - 1, std::max<int64_t>(1, std::llround(double(dense) * f)));
  const char* ek = c.contains("n_routed_experts") ? "n_routed_experts"
                   : c.contains("num_experts")    ? "num_experts"
                                                  : "num_local_experts";
  if (num(ek) > 0) {
    const int64_t top_k = num("num_experts_per_tok");
    int64_t e = std::max<int64_t>(std::max<int64_t>(top_k, 2), std::llround(double(num(ek)) * f));
    const int64_t groups = std::max<int64_t>(1, num("n_group"));
    if (e % groups != 0 || e / groups < 2) {
      c["n_group"] = 1;
      c["topk_group"] = 1;
    }
    c[ek] = e;
  }
  c["num_nextn_predict_layers"] = 0;
  c["vocab_size"] = vocab_override > 0 ? vocab_override : round_to(double(num("vocab_size")) * f, 64, 256);
  c["torch_dtype"] = "bfloat16";
  c["tie_word_embeddings"] = false;
  return c;
}

namespace {
// One tensor to write, [rows, cols] (cols 0: a vector); fill: 0 random, 1
// ones, 2 zeros.
struct SynthTensor {
  std::string name;
  int64_t rows, cols;
  int fill;
};

// model.safetensors in o.out: every tensor in BF16, random ones from o.seed.
Result<void> write_tensors(const SynthOptions& o, const std::vector<SynthTensor>& ts,
                           SynthSummary& sum) {
  std::vector<TensorSpec> specs;
  for (const auto& t : ts) {
    specs.push_back({t.name, DType::BF16, t.cols ? std::vector<int64_t>{t.rows, t.cols} : std::vector<int64_t>{t.rows}});
    sum.params += t.rows * std::max<int64_t>(t.cols, 1);
  }
  auto w = SafetensorsWriter::create(o.out, specs);
  if (!w) return w.error();
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> nd(0.f, o.init_std);
  std::vector<uint8_t> buf;
  for (const auto& t : ts) {
    const int64_t n = t.rows * std::max<int64_t>(t.cols, 1);
    buf.resize(size_t(n) * 2);
    auto* out = reinterpret_cast<uint16_t*>(buf.data());
    for (int64_t i = 0; i < n; ++i)
      out[i] = f32_to_bf16(t.fill == 1 ? 1.f : t.fill == 2 ? 0.f : nd(rng));
    KV_TRY(w->write(t.name, buf));
  }
  KV_TRY(w->finish());
  sum.bytes = w->total_bytes();
  return {};
}
}  // namespace

Result<SynthSummary> synth_checkpoint(const SynthOptions& o) {
  std::error_code ec;
  const std::string path = fs::is_directory(o.like, ec) ? (fs::path(o.like) / "config.json").string() : o.like;
  auto like = read_json_file(path);
  if (!like) return like.error();
  int64_t vocab = 0;
  std::optional<GgufFile> tok;
  if (!o.tokenizer.empty()) {
    auto g = GgufFile::open(o.tokenizer);
    if (!g) return g.error();
    const auto* toks = g->get_strings("tokenizer.ggml.tokens");
    if (!toks) return make_error(o.tokenizer + ": no tokenizer.ggml.tokens");
    vocab = int64_t(toks->size());
    tok.emplace(std::move(*g));
  }
  auto cfg = synth_config(*like, o.scale, vocab);
  if (!cfg) return cfg.error();
  if (o.mtp) (*cfg)["num_nextn_predict_layers"] = 1;
  const json& c = *cfg;
  const std::string arch = c["architectures"][0].get<std::string>();
  auto num = [&](const char* k) -> int64_t {
    return c.contains(k) && c[k].is_number() ? c[k].get<int64_t>() : 0;
  };
  const int64_t V = num("vocab_size"), H = num("hidden_size"), L = num("num_hidden_layers"),
                NH = num("num_attention_heads"), KVH = num("num_key_value_heads"),
                ffn = num("intermediate_size"), mffn = num("moe_intermediate_size");
  const int64_t E = num("n_routed_experts") ? num("n_routed_experts")
                    : num("num_experts")    ? num("num_experts")
                                            : num("num_local_experts");
  const int64_t shared = num("n_shared_experts");
  const int64_t dense = E > 0 ? num("first_k_dense_replace") : L;
  const bool mla = num("kv_lora_rank") > 0;

  std::vector<SynthTensor> ts;
  ts.push_back({"model.embed_tokens.weight", V, H, 0});
  for (int64_t l = 0; l < L + (o.mtp ? 1 : 0); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (l == L) {  // the MTP layer's own parts
      ts.push_back({p + "enorm.weight", H, 0, 1});
      ts.push_back({p + "hnorm.weight", H, 0, 1});
      ts.push_back({p + "eh_proj.weight", H, 2 * H, 0});
      ts.push_back({p + "shared_head.norm.weight", H, 0, 1});
    }
    ts.push_back({p + "input_layernorm.weight", H, 0, 1});
    ts.push_back({p + "post_attention_layernorm.weight", H, 0, 1});
    if (mla) {
      const int64_t ql = num("q_lora_rank"), kl = num("kv_lora_rank"), nope = num("qk_nope_head_dim"),
                    rope = num("qk_rope_head_dim"), vd = num("v_head_dim");
      const std::string a = p + "self_attn.";
      if (ql > 0) {
        ts.push_back({a + "q_a_proj.weight", ql, H, 0});
        ts.push_back({a + "q_a_layernorm.weight", ql, 0, 1});
        ts.push_back({a + "q_b_proj.weight", NH * (nope + rope), ql, 0});
      } else {
        ts.push_back({a + "q_proj.weight", NH * (nope + rope), H, 0});
      }
      ts.push_back({a + "kv_a_proj_with_mqa.weight", kl + rope, H, 0});
      ts.push_back({a + "kv_a_layernorm.weight", kl, 0, 1});
      ts.push_back({a + "kv_b_proj.weight", NH * (nope + vd), kl, 0});
      ts.push_back({a + "o_proj.weight", H, NH * vd, 0});
      const int64_t ih = num("index_n_heads"), ihd = num("index_head_dim");
      if (ih > 0 && ihd > 0 && ql > 0) {
        ts.push_back({a + "indexer.wq_b.weight", ih * ihd, ql, 0});
        ts.push_back({a + "indexer.wk.weight", ihd, H, 0});
        ts.push_back({a + "indexer.k_norm.weight", ihd, 0, 1});
        ts.push_back({a + "indexer.k_norm.bias", ihd, 0, 2});
        ts.push_back({a + "indexer.weights_proj.weight", ih, H, 0});
      }
    } else {
      const int64_t hd = num("head_dim") ? num("head_dim") : H / NH;
      const std::string a = p + "self_attn.";
      ts.push_back({a + "q_proj.weight", NH * hd, H, 0});
      ts.push_back({a + "k_proj.weight", KVH * hd, H, 0});
      ts.push_back({a + "v_proj.weight", KVH * hd, H, 0});
      ts.push_back({a + "o_proj.weight", H, NH * hd, 0});
      if (arch == "Qwen3MoeForCausalLM" || arch == "Qwen3ForCausalLM" ||
          (c.contains("use_qk_norm") && c["use_qk_norm"].is_boolean() && c["use_qk_norm"].get<bool>())) {
        ts.push_back({a + "q_norm.weight", hd, 0, 1});
        ts.push_back({a + "k_norm.weight", hd, 0, 1});
      }
      if (c.value("attention_bias", false)) {
        ts.push_back({a + "q_proj.bias", NH * hd, 0, 2});
        ts.push_back({a + "k_proj.bias", KVH * hd, 0, 2});
        ts.push_back({a + "v_proj.bias", KVH * hd, 0, 2});
      }
    }
    const std::string m = p + "mlp.";
    if (l < dense || E == 0) {
      ts.push_back({m + "gate_proj.weight", ffn, H, 0});
      ts.push_back({m + "up_proj.weight", ffn, H, 0});
      ts.push_back({m + "down_proj.weight", H, ffn, 0});
      continue;
    }
    ts.push_back({m + "gate.weight", E, H, 0});
    if (arch != "Qwen3MoeForCausalLM") ts.push_back({m + "gate.e_score_correction_bias", E, 0, 2});
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      ts.push_back({x + "gate_proj.weight", mffn, H, 0});
      ts.push_back({x + "up_proj.weight", mffn, H, 0});
      ts.push_back({x + "down_proj.weight", H, mffn, 0});
    }
    if (shared > 0) {
      ts.push_back({m + "shared_experts.gate_proj.weight", shared * mffn, H, 0});
      ts.push_back({m + "shared_experts.up_proj.weight", shared * mffn, H, 0});
      ts.push_back({m + "shared_experts.down_proj.weight", H, shared * mffn, 0});
    }
  }
  ts.push_back({"model.norm.weight", H, 0, 1});
  ts.push_back({"lm_head.weight", V, H, 0});

  fs::create_directories(o.out, ec);
  if (ec) return make_error(o.out + ": cannot create: " + ec.message());
  SynthSummary sum;
  KV_TRY(write_tensors(o, ts, sum));
  json out = c;
  {
    std::ofstream f(fs::path(o.out) / "config.json");
    f << out.dump(2) << "\n";
    if (!f) return make_error(o.out + "/config.json: write failed");
  }
  if (tok) {
    std::vector<std::pair<std::string, GgufValue>> kv;
    for (const auto& [k, v] : tok->metadata())
      if (k.rfind("tokenizer.", 0) == 0 || k == "general.architecture") kv.emplace_back(k, v);
    KV_TRY(write_gguf_metadata((fs::path(o.out) / "tokenizer.gguf").string(), kv));
  }
  sum.config = std::move(out);
  return sum;
}

}  // namespace kvant
