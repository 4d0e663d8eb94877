// kvant quantize's library side (quant/checkpoint.h) on tiny synthetic
// Hugging Face checkpoints written with io/'s writer, in F32 and in FP8 with
// 128x128 block scales: every quantized linear dequantizes within the RTN
// bound of the original, kept tensors are bit-identical BF16 (F32 for 1-D
// F32 inputs), config.json loads back. With the GGUF models present, a GGUF
// exported with nothing quantized loads into the same weights as the GGUF.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "io/compressed_tensors.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/archs/arch.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/model.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"
#include "quant/checkpoint.h"
#include "numerics/int4_rtn.h"
#include "tokenizer/tokenizer.h"

namespace kvant {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("kvant_qc_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

struct Synth {
  int64_t vocab = 64, hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, ffn = 80;
  bool fp8 = false;
  bool tied = false;
  std::map<std::string, std::vector<float>> values;  // what each tensor decodes to
  std::map<std::string, std::vector<int64_t>> shapes;
};

// Writes config.json, tokenizer.json and the weights; records each tensor's decoded values.
void write_synth(const std::string& dir, Synth& s) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<TensorData> ts;
  auto add_f32 = [&](const std::string& name, std::vector<int64_t> shape, DType dt) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng) + (shape.size() == 1 ? 1.f : 0.f);
    TensorData t{{name, dt, shape}, {}};
    if (dt == DType::F32) {
      t.bytes.resize(v.size() * 4);
      std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    } else {  // BF16
      for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
      t.bytes.resize(v.size() * 2);
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = f32_to_bf16(v[i]);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
    }
    s.values[name] = v;
    s.shapes[name] = shape;
    ts.push_back(std::move(t));
  };
  auto add_linear = [&](const std::string& name, int64_t rows, int64_t cols) {
    if (!s.fp8) return add_f32(name, {rows, cols}, DType::F32);
    const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
    std::vector<float> sc(size_t(br * bc));
    for (size_t i = 0; i < sc.size(); ++i) sc[i] = 0.0005f * float(i + 1);
    std::vector<uint8_t> codes(size_t(rows * cols));
    std::vector<float> v(codes.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = size_t(r * cols + c);
        const float blk = sc[size_t((r / 128) * bc + c / 128)];
        codes[i] = f32_to_fp8_e4m3(nd(rng) / blk);
        v[i] = fp8_e4m3_to_f32(codes[i]) * blk;
      }
    ts.push_back({{name, DType::F8_E4M3, {rows, cols}}, codes});
    std::vector<uint8_t> sb(sc.size() * 4);
    std::memcpy(sb.data(), sc.data(), sb.size());
    ts.push_back({{name + "_scale_inv", DType::F32, {br, bc}}, sb});
    s.values[name] = v;
    s.shapes[name] = {rows, cols};
  };
  const DType small = s.fp8 ? DType::BF16 : DType::F32;
  add_f32("model.embed_tokens.weight", {s.vocab, s.hidden}, small);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add_f32(p + "input_layernorm.weight", {s.hidden}, small);
    add_linear(p + "self_attn.q_proj.weight", s.heads * s.head_dim, s.hidden);
    add_linear(p + "self_attn.k_proj.weight", s.kv_heads * s.head_dim, s.hidden);
    add_linear(p + "self_attn.v_proj.weight", s.kv_heads * s.head_dim, s.hidden);
    add_linear(p + "self_attn.o_proj.weight", s.hidden, s.heads * s.head_dim);
    add_f32(p + "post_attention_layernorm.weight", {s.hidden}, small);
    add_linear(p + "mlp.gate_proj.weight", s.ffn, s.hidden);
    add_linear(p + "mlp.up_proj.weight", s.ffn, s.hidden);
    add_linear(p + "mlp.down_proj.weight", s.hidden, s.ffn);
  }
  add_f32("model.norm.weight", {s.hidden}, small);
  if (!s.tied) add_f32("lm_head.weight", {s.vocab, s.hidden}, small);

  std::vector<TensorSpec> specs;
  for (auto& t : ts) specs.push_back(t.spec);
  auto w = SafetensorsWriter::create(dir, specs, 1 << 18);  // the FP8 variant is sharded
  ASSERT_TRUE(w.ok()) << w.error().message;
  for (auto& t : ts) ASSERT_TRUE(w->write(t.spec.name, t.bytes).ok());
  ASSERT_TRUE(w->finish().ok());

  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                        {"vocab_size", s.vocab}, {"hidden_size", s.hidden},
                        {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads},
                        {"num_key_value_heads", s.kv_heads}, {"head_dim", s.head_dim},
                        {"intermediate_size", s.ffn}, {"rms_norm_eps", 1e-5},
                        {"tie_word_embeddings", s.tied}};
  if (s.fp8)
    cfg["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  std::ofstream(fs::path(dir) / "config.json") << cfg.dump();
  std::ofstream(fs::path(dir) / "tokenizer.json") << "{}";
}

// Checks every output tensor against the synthetic input.
void check_output(const std::string& out, const Synth& s, int group, bool asym,
                  const std::set<std::string>& expect_kept_linears) {
  auto src = open_safetensors_source(out);
  ASSERT_TRUE(src.ok()) << src.error().message;
  for (const auto& [name, v] : s.values) {
    const auto& shape = s.shapes.at(name);
    const std::string base = name.substr(0, name.size() - 7);
    const bool linear = shape.size() == 2 && name.rfind("model.layers.", 0) == 0;
    if (linear && !expect_kept_linears.count(base)) {
      ASSERT_TRUE(has_int4_weight(**src, base)) << base;
      EXPECT_FALSE((*src)->find(name)) << name;
      auto q = read_int4_weight(**src, base);
      ASSERT_TRUE(q.ok()) << q.error().message;
      EXPECT_EQ(q->group, group);
      EXPECT_EQ(q->zero.empty(), !asym);
      std::vector<float> back(v.size());
      dequantize(*q, back.data());
      for (size_t i = 0; i < v.size(); ++i) {
        const float sc = std::fabs(q->scale[i / size_t(group)]);  // one row of groups follows another
        ASSERT_LE(std::fabs(v[i] - back[i]), (asym ? 0.6f : 1.032f) * sc) << name << " " << i;
      }
      continue;
    }
    const TensorRef* t = (*src)->find(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(t->shape, shape);
    if (t->dtype == DType::F32) {
      EXPECT_EQ(shape.size(), 1u);
      EXPECT_EQ(std::memcmp(t->data.data(), v.data(), v.size() * 4), 0) << name;
    } else {
      ASSERT_EQ(t->dtype, DType::BF16) << name;
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, t->data.data() + 2 * i, 2);
        ASSERT_EQ(h, f32_to_bf16(v[i])) << name << " " << i;
      }
    }
  }
  for (const auto& t : (*src)->tensors()) EXPECT_EQ(t.name.find("_scale_inv"), std::string::npos) << t.name;
}

TEST(QuantCheckpoint, F32CheckpointSymmetric) {
  const std::string in = temp_dir("f32_in"), out = temp_dir("f32_out");
  Synth s;
  write_synth(in, s);
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.group_size = 32;
  auto r = quantize_checkpoint(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  // q, k, v, o, gate, up per layer; down_proj has 80 columns, not a multiple of 32.
  EXPECT_EQ(r->quantized_tensors, 12);
  EXPECT_EQ(r->kept_tensors, 9);
  EXPECT_EQ(r->warnings.size(), 2u);
  check_output(out, s, 32, false, {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"});
  EXPECT_GT(r->quantized_bf16_bytes, 3 * r->quantized_int4_bytes);
  EXPECT_GT(r->mean_rel_rms, 0.02);  // Gaussian weights, group 32: about 0.08
  EXPECT_LT(r->max_rel_rms, 0.12);

  auto mc = config_from_hf_json((fs::path(out) / "config.json").string());
  ASSERT_TRUE(mc.ok()) << mc.error().message;
  EXPECT_EQ(mc->hidden, 64);
  auto cfg = read_hf_config(out);
  ASSERT_TRUE(cfg.ok());
  auto qc = parse_quantization_config(*cfg);
  ASSERT_TRUE(qc.ok()) << qc.error().message;
  ASSERT_TRUE(qc->has_value());
  EXPECT_EQ((*qc)->group_size, 32);
  EXPECT_TRUE((*qc)->symmetric);
  const auto& ig = (*qc)->ignore;
  EXPECT_NE(std::find(ig.begin(), ig.end(), "lm_head"), ig.end());
  EXPECT_NE(std::find(ig.begin(), ig.end(), "model.layers.1.mlp.down_proj"), ig.end());
  EXPECT_TRUE(fs::exists(fs::path(out) / "tokenizer.json"));
}

TEST(QuantCheckpoint, AsymmetricKeepPatternAndGroup64) {
  const std::string in = temp_dir("asym_in"), out = temp_dir("asym_out");
  Synth s;
  s.ffn = 128;
  write_synth(in, s);
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.group_size = 64;
  o.asymmetric = true;
  o.keep = {"self_attn\\.o_proj", "layers\\.1\\.mlp\\.up"};
  auto r = quantize_checkpoint(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->warnings.empty());
  check_output(out, s, 64, true,
               {"model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.up_proj"});
  {  // Loaded as it is, the kept o_proj stays BF16; gate|up of layer 1 has an
     // INT4 part, so the fused product is INT4. Asked for int4, all are.
    auto native = load_model(out);
    ASSERT_TRUE(native.ok()) << native.error().message;
    for (const auto& L : native->weights.layers) {
      EXPECT_TRUE(L.wo_q.empty());
      EXPECT_GT(L.wo.rows, 0);
      EXPECT_FALSE(L.wqkv_q.empty());
      EXPECT_FALSE(L.w_gate_up_q.empty());
    }
    WeightSetOptions w;
    w.precision = WeightPrecision::kInt4;
    auto int4 = load_model(out, w);
    ASSERT_TRUE(int4.ok()) << int4.error().message;
    for (const auto& L : int4->weights.layers) EXPECT_FALSE(L.wo_q.empty());
    // A model with native prefill and int4 decode holds both sets.
    auto m = Model::load(out, {WeightPrecision::kNative, WeightPrecision::kInt4});
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_NE((*m)->prefill_set(), (*m)->decode_set());
    EXPECT_EQ((*m)->set_precision((*m)->prefill_set()), "mixed");
    EXPECT_EQ((*m)->set_precision((*m)->decode_set()), "int4");
  }
  o.keep = {"("};
  EXPECT_FALSE(quantize_checkpoint(o).ok());
  o.keep = {};
  o.out = in;
  auto same_dir = quantize_checkpoint(o);
  ASSERT_FALSE(same_dir.ok());
  EXPECT_NE(same_dir.error().message.find("is the input directory"), std::string::npos);
}

TEST(QuantCheckpoint, Fp8BlockScaledCheckpoint) {
  const std::string in = temp_dir("fp8_in"), out = temp_dir("fp8_out");
  Synth s;
  s.fp8 = true;
  s.hidden = 256;
  s.head_dim = 64;
  s.ffn = 160;  // blocks of 128 with a partial one
  write_synth(in, s);
  ASSERT_TRUE(fs::exists(fs::path(in) / "model.safetensors.index.json"));
  {  // The source applies the block scales: what quantize reads is what the test recorded.
    auto src = open_safetensors_source(in);
    ASSERT_TRUE(src.ok()) << src.error().message;
    for (const auto& [name, v] : s.values) {
      std::vector<float> got(v.size());
      ASSERT_TRUE((*src)->read_f32(*(*src)->find(name), got).ok());
      for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], v[i]) << name << " " << i;
    }
  }
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.group_size = 32;
  auto r = quantize_checkpoint(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->quantized_tensors, 14);
  check_output(out, s, 32, false, {});
  auto cfg = read_hf_config(out);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ((*cfg)["quantization_config"]["quant_method"], "compressed-tensors");
  // Quantizing an already-quantized directory is refused.
  o.in = out;
  o.out = temp_dir("fp8_again");
  auto again = quantize_checkpoint(o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("already quantized"), std::string::npos);
}

TEST(QuantCheckpoint, QuantizeLmHeadUntiesEmbeddings) {
  const std::string in = temp_dir("tied_in"), out = temp_dir("tied_out");
  Synth s;
  s.tied = true;
  write_synth(in, s);
  QuantizeOptions o;
  o.in = in;
  o.out = out;
  o.group_size = 32;
  o.quantize_lm_head = true;
  auto r = quantize_checkpoint(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto src = open_safetensors_source(out);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(has_int4_weight(**src, "lm_head"));
  auto q = read_int4_weight(**src, "lm_head");
  ASSERT_TRUE(q.ok());
  std::vector<float> back(size_t(64 * 64));
  dequantize(*q, back.data());
  const auto& e = s.values["model.embed_tokens.weight"];
  for (size_t i = 0; i < back.size(); ++i)
    ASSERT_LE(std::fabs(back[i] - e[i]), 1.032f * std::fabs(q->scale[i / 32]));
  auto cfg = read_hf_config(out);
  ASSERT_TRUE(cfg.ok());
  EXPECT_EQ((*cfg)["tie_word_embeddings"], false);
  auto qc = parse_quantization_config(*cfg);
  ASSERT_TRUE(qc.ok() && qc->has_value());
  EXPECT_EQ(std::find((*qc)->ignore.begin(), (*qc)->ignore.end(), "lm_head"), (*qc)->ignore.end());
}

// A GGUF written out with every tensor kept (--keep '.*') must load into the
// same weights as the GGUF itself: names, q/k un-permutation, Gemma norms.
void expect_same_model(const std::string& gguf) {
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " not present";
  const std::string out = temp_dir("gguf_" + fs::path(gguf).stem().string());
  QuantizeOptions o;
  o.in = gguf;
  o.out = out;
  o.keep = {".*"};
  auto r = quantize_checkpoint(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->quantized_tensors, 0);
  {  // Nothing quantized: a plain checkpoint, no quantization_config.
    auto cfg = read_hf_config(out);
    ASSERT_TRUE(cfg.ok());
    EXPECT_FALSE(cfg->contains("quantization_config"));
  }
  auto a = load_model(gguf);
  auto b = load_model(out);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  const auto &ca = a->config, &cb = b->config;
  EXPECT_EQ(ca.arch, cb.arch);
  EXPECT_EQ(ca.vocab, cb.vocab);
  EXPECT_EQ(ca.hidden, cb.hidden);
  EXPECT_EQ(ca.layers, cb.layers);
  EXPECT_EQ(ca.heads, cb.heads);
  EXPECT_EQ(ca.kv_heads, cb.kv_heads);
  EXPECT_EQ(ca.head_dim, cb.head_dim);
  EXPECT_EQ(ca.ffn, cb.ffn);
  EXPECT_EQ(ca.max_positions, cb.max_positions);
  EXPECT_EQ(ca.rms_eps, cb.rms_eps);
  EXPECT_EQ(ca.tie_embeddings, cb.tie_embeddings);
  EXPECT_EQ(ca.rope.theta, cb.rope.theta);
  EXPECT_EQ(ca.rope_local.theta, cb.rope_local.theta);
  EXPECT_EQ(ca.sliding_window, cb.sliding_window);
  EXPECT_EQ(ca.sliding, cb.sliding);
  EXPECT_FLOAT_EQ(ca.attn_scale, cb.attn_scale);
  EXPECT_EQ(ca.embed_scale, cb.embed_scale);
  EXPECT_EQ(ca.bos_id, cb.bos_id);
  EXPECT_EQ(ca.eos_id, cb.eos_id);
  // BF16 matrices compare row by row. The loader may hold a GGUF's 4-bit
  // weights in its INT4 form instead (an empty Matrix): nothing to compare then.
  int compared = 0;
  auto same = [&](const Matrix& x, const Matrix& y) {
    if (x.rows == 0 || y.rows == 0) return true;
    ++compared;
    if (x.rows != y.rows || x.cols != y.cols) return false;
    std::vector<float> a(size_t(x.cols)), b(size_t(y.cols));
    for (int64_t r = 0; r < x.rows; ++r) {
      x.row_f32(r, 1.f, a.data());
      y.row_f32(r, 1.f, b.data());
      if (a != b) return false;
    }
    return true;
  };
  // Norms: Gemma's 1 + w goes through w and back, exact to within an ulp.
  auto near = [](const std::vector<float>& x, const std::vector<float>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::fabs(x[i] - y[i]) > 1e-6f * std::max(1.f, std::fabs(x[i]))) return false;
    return true;
  };
  const auto &wa = a->weights, &wb = b->weights;
  EXPECT_TRUE(same(wa.embed, wb.embed));
  EXPECT_TRUE(same(wa.output, wb.output));
  EXPECT_TRUE(near(wa.out_norm, wb.out_norm));
  ASSERT_EQ(wa.layers.size(), wb.layers.size());
  for (size_t l = 0; l < wa.layers.size(); ++l) {
    const auto &x = wa.layers[l], &y = wb.layers[l];
    EXPECT_TRUE(same(x.wqkv, y.wqkv)) << l;
    EXPECT_TRUE(same(x.wo, y.wo)) << l;
    EXPECT_TRUE(same(x.w_gate_up, y.w_gate_up)) << l;
    EXPECT_TRUE(same(x.w_down, y.w_down)) << l;
    EXPECT_TRUE(near(x.attn_norm, y.attn_norm)) << l;
    EXPECT_TRUE(near(x.ffn_norm, y.ffn_norm)) << l;
    EXPECT_TRUE(near(x.q_norm, y.q_norm)) << l;
    EXPECT_TRUE(near(x.k_norm, y.k_norm)) << l;
    EXPECT_TRUE(near(x.post_attn_norm, y.post_attn_norm)) << l;
    EXPECT_TRUE(near(x.post_ffn_norm, y.post_ffn_norm)) << l;
  }
  EXPECT_GE(compared, 4 * int(wa.layers.size()) + 1);
  // The tokenizer travels as tokenizer.gguf and encodes the same.
  auto g1 = GgufFile::open(gguf);
  auto g2 = GgufFile::open((fs::path(out) / "tokenizer.gguf").string());
  ASSERT_TRUE(g1.ok() && g2.ok());
  auto t1 = Tokenizer::from_gguf(*g1);
  auto t2 = Tokenizer::from_gguf(*g2);
  ASSERT_TRUE(t1.ok() && t2.ok()) << (t2.ok() ? "" : t2.error().message);
  const std::string text = "Hello, world! <|im_start|>user\nQuantize 1234 weights: ünïcödé";
  EXPECT_EQ(t1->encode(text, true), t2->encode(text, true));
  EXPECT_EQ(g1->get_string("tokenizer.chat_template"), g2->get_string("tokenizer.chat_template"));
  fs::remove_all(out);
}

TEST(QuantCheckpointModels, SmolLM2GgufExportsToSameWeights) {
  expect_same_model(std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf");
}
TEST(QuantCheckpointModels, Gemma3GgufExportsToSameWeights) {
  expect_same_model(std::string(KVANT_MODELS) + "/gemma-3-270m-q4_k_m.gguf");
}

}  // namespace
}  // namespace kvant
