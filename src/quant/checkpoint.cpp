// One pass over the input in its own tensor order: every tensor is read to
// FP32 (GGUF blocks and FP8 block scales decoded by the TensorSource), put in
// HF's convention, then quantized or narrowed, written, and dropped, so peak
// memory is one tensor in FP32 plus its output. All output specs are
// declared first so the safetensors shard split is known before writing.
#include "quant/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <regex>

#include "core/threads.h"
#include "io/compressed_tensors.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "io/hf_config.h"
#include "io/tensor_source.h"
#include "model/config.h"
#include "model/hf_export.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"
#include "numerics/fp8_block.h"
#include "numerics/int4_rtn.h"

namespace kvant {
namespace fs = std::filesystem;
namespace {

struct Item {
  const TensorRef* src = nullptr;
  std::string out;  // HF name
  std::vector<int64_t> shape;
  bool quantize = false;
  DType out_dtype = DType::BF16;  // kept tensors
  int64_t unpermute_heads = 0;
  float add = 0.f;
};

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool is_int_dtype(DType t) {
  return t == DType::I8 || t == DType::I16 || t == DType::I32 || t == DType::I64 || t == DType::U8;
}

// A 2-D weight of a transformer block's linear layer (attention, MLP, MoE
// experts, MLA projections); routers, norms and embeddings are not.
bool is_block_linear(const std::string& n, const std::vector<int64_t>& shape) {
  return shape.size() == 2 && n.rfind("model.layers.", 0) == 0 && ends_with(n, ".weight") &&
         n.find("norm") == std::string::npos && !ends_with(n, ".mlp.gate.weight") &&
         n.find("embed") == std::string::npos;
}

uint64_t input_bytes(const std::string& in) {
  std::error_code ec;
  fs::path dir = fs::is_directory(in, ec) ? fs::path(in) : fs::path();
  if (dir.empty() && ends_with(in, ".json")) dir = fs::path(in).parent_path();
  if (dir.empty()) return fs::file_size(in, ec);
  uint64_t n = 0;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") n += e.file_size();
  return n;
}

Result<void> read_rows_parallel(const TensorSource& s, const TensorRef& t, std::vector<float>& out) {
  out.resize(size_t(t.numel()));
  const int64_t rows = TensorSource::num_rows(t), len = TensorSource::row_length(t);
  std::mutex mu;
  std::optional<Error> err;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(len, 1));
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    auto r = s.read_f32_rows(t, b, e, std::span<float>(out.data() + b * len, size_t((e - b) * len)));
    if (!r) {
      std::lock_guard<std::mutex> l(mu);
      if (!err) err = r.error();
    }
  });
  if (err) return *err;
  return {};
}

template <class T>
std::span<const uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

Result<void> write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  f.close();
  if (!f) return make_error(p.string() + ": write failed");
  return {};
}

// tokenizer.gguf (the input's tokenizer.* metadata and architecture, no
// tensors) and tokenizer_config.json with the chat template and bos/eos.
Result<void> write_gguf_tokenizer(const GgufFile& g, const fs::path& out, std::vector<std::string>& files) {
  std::vector<std::pair<std::string, GgufValue>> kv;
  for (const auto& [k, v] : g.metadata())
    if (k.rfind("tokenizer.", 0) == 0 || k == "general.architecture") kv.emplace_back(k, v);
  KV_TRY(write_gguf_metadata((out / "tokenizer.gguf").string(), kv));
  files.push_back("tokenizer.gguf");
  nlohmann::ordered_json tc;
  tc["tokenizer_file"] = "tokenizer.gguf";
  if (auto t = g.get_string("tokenizer.chat_template")) tc["chat_template"] = *t;
  const auto* toks = g.get_strings("tokenizer.ggml.tokens");
  for (auto [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token"},
                            {"tokenizer.ggml.eos_token_id", "eos_token"},
                            {"tokenizer.ggml.unknown_token_id", "unk_token"},
                            {"tokenizer.ggml.padding_token_id", "pad_token"}}) {
    auto id = g.get_int(key);
    if (id && toks && *id >= 0 && size_t(*id) < toks->size()) tc[field] = (*toks)[size_t(*id)];
  }
  if (const auto* v = g.find("tokenizer.ggml.add_bos_token"); v && v->type == GgufType::Bool)
    tc["add_bos_token"] = v->b;
  KV_TRY(write_text(out / "tokenizer_config.json", tc.dump(2) + "\n"));
  files.push_back("tokenizer_config.json");
  return {};
}

// The --keep patterns as ECMAScript regexes.
Result<std::vector<std::regex>> compile_keep_patterns(const std::vector<std::string>& patterns) {
  std::vector<std::regex> keep;
  for (const auto& k : patterns) {
    try {
      keep.emplace_back(k, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return make_error("quantize: --keep pattern '" + k + "' is not a valid regex: " + e.what());
    }
  }
  return keep;
}

// Records a warning in the summary and passes it to the caller's callback.
void add_warning(const QuantizeOptions& o, QuantizeSummary& sum, const std::string& m) {
  sum.warnings.push_back(m);
  if (o.warn) o.warn(m);
}

// What the input says about the model besides its tensors.
struct InputConfig {
  nlohmann::json config;      // the output's config.json, before quantization_config
  std::optional<GgufFile> g;  // a GGUF input's metadata
  ModelConfig mc;             // a GGUF input's model config
  fs::path in_dir;            // a safetensors input's directory
};

// Reads the input's config: from a GGUF's metadata, else from config.json in
// the input's directory (which must not be quantized already).
Result<void> read_input_config(const QuantizeOptions& o, bool is_dir, bool gguf, InputConfig& in) {
  if (gguf) {
    auto gr = GgufFile::open(o.in);
    if (!gr) return gr.error();
    in.g.emplace(std::move(*gr));
    auto c = config_from_gguf(*in.g);
    if (!c) return c.error();
    in.mc = *c;
    in.config = hf_config_json(in.mc);
  } else {
    in.in_dir = is_dir ? fs::path(o.in) : fs::path(o.in).parent_path();
    auto c = read_hf_config(in.in_dir.string());
    if (!c) return make_error(c.error().message + " (quantize needs the input's config.json)");
    in.config = std::move(*c);
    nlohmann::json& config = in.config;
    if (config.contains("quantization_config") && config["quantization_config"].is_object() &&
        config["quantization_config"].value("quant_method", std::string()) == "compressed-tensors")
      return make_error(o.in + ": already quantized (compressed-tensors quantization_config)");
  }
  return {};
}

// The planned output tensor named n, or null.
Item* find_item(std::vector<Item>& items, const std::string& n) {
  for (auto& i : items)
    if (i.out == n) return &i;
  return nullptr;
}

// One item per output tensor, in the input's order, with its Hugging Face
// name (FP8 block scales are applied on read and have none); with
// quantize_lm_head and tied embeddings, an untied lm_head copied from them.
Result<std::vector<Item>> plan_items(const TensorSource& src, const QuantizeOptions& o, bool gguf,
                                     InputConfig& in) {
  std::vector<Item> items;
  for (const auto& t : src.tensors()) {
    if (!gguf && (ends_with(t.name, "_scale_inv") || ends_with(t.name, ".weight_scale"))) {
      const size_t cut = ends_with(t.name, "_scale_inv") ? 10 : 6;
      const auto* w = src.find(t.name.substr(0, t.name.size() - cut));
      if (w && (w->dtype == DType::F8_E4M3 || w->dtype == DType::F8_E5M2))
        continue;  // applied on read
    }
    Item it;
    it.src = &t;
    it.shape = t.shape;
    it.out = t.name;
    if (gguf) {
      auto m = gguf_to_hf(t.name, in.mc);
      if (!m) return make_error(o.in + ": " + m.error().message);
      it.out = m->hf_name;
      it.unpermute_heads = m->unpermute_heads;
      it.add = m->add;
    }
    items.push_back(std::move(it));
  }
  if (o.quantize_lm_head && !find_item(items, "lm_head.weight")) {
    Item* e = find_item(items, "model.embed_tokens.weight");
    if (!e)
      return make_error(o.in +
                        ": --quantize-lm-head: neither lm_head.weight nor "
                        "model.embed_tokens.weight found");
    Item lm = *e;
    lm.out = "lm_head.weight";
    items.push_back(lm);
    in.config["tie_word_embeddings"] = false;
  }
  return items;
}

// Decides which items are quantized and their output dtypes, and returns
// every output tensor's spec; the modules kept at high precision go to
// sum.ignore.
std::vector<TensorSpec> plan_specs(std::vector<Item>& items, const QuantizeOptions& o,
                                   const std::vector<std::regex>& keep, QuantizeSummary& sum) {
  std::vector<TensorSpec> specs;
  for (auto& it : items) {
    const bool linear =
        is_block_linear(it.out, it.shape) || (o.quantize_lm_head && it.out == "lm_head.weight");
    bool q = linear && !is_int_dtype(it.src->dtype);
    if (q && std::any_of(keep.begin(), keep.end(),
                         [&](const std::regex& r) { return std::regex_search(it.out, r); }))
      q = false;
    // A group size that does not divide the columns leaves a short last
    // group (ceil(cols / group) scales per row), which kvant and
    // compressed-tensors read; strict_groups keeps such linears in BF16 for
    // engines whose kernels need whole groups. Columns must be a multiple
    // of 32 either way (kvant's INT4 kernels take 32 at a time).
    if (q && o.format == QuantFormat::kInt4 && it.shape[1] % o.group_size != 0 &&
        (o.strict_groups || it.shape[1] % 32 != 0)) {
      add_warning(o, sum,
                  it.out + ": " + std::to_string(it.shape[1]) + " columns are not a multiple of " +
                      std::to_string(o.strict_groups ? o.group_size : 32) + "; kept in BF16");
      q = false;
    }
    it.quantize = q;
    const std::string base = it.out.substr(0, it.out.size() - 7);  // without ".weight"
    if (q && o.format == QuantFormat::kFp8) {
      const int64_t B = kFp8WeightBlock;
      specs.push_back({it.out, DType::F8_E4M3, it.shape});
      specs.push_back({it.out + "_scale", DType::F32,
                       {(it.shape[0] + B - 1) / B, (it.shape[1] + B - 1) / B}});
      continue;
    }
    if (q) {
      for (auto& s : int4_weight_specs(base, it.shape[0], it.shape[1], o.group_size, o.asymmetric))
        specs.push_back(s);
      continue;
    }
    if (is_int_dtype(it.src->dtype))
      it.out_dtype = it.src->dtype;
    else if (it.shape.size() <= 1 && it.src->dtype == DType::F32)
      it.out_dtype = DType::F32;
    else
      it.out_dtype = DType::BF16;
    specs.push_back({it.out, it.out_dtype, it.shape});
    if (it.shape.size() == 2 && ends_with(it.out, ".weight") &&
        it.out.find("embed") == std::string::npos)
      sum.ignore.push_back(base);
  }
  if (!find_item(items, "lm_head.weight") &&
      std::find(sum.ignore.begin(), sum.ignore.end(), "lm_head") == sum.ignore.end())
    sum.ignore.push_back("lm_head");  // tied: the module exists and stays high precision
  return specs;
}

// Reads every item to FP32 in turn, quantizes or narrows it and writes it,
// counting sizes and errors in the summary; then finishes the writer.
Result<void> write_tensors(const TensorSource& src, const std::vector<Item>& items,
                           const QuantizeOptions& o, SafetensorsWriter& w, QuantizeSummary& sum) {
  std::vector<float> v;
  double rel_rms_sum = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    if (o.progress) o.progress(i + 1, items.size(), it.out, it.quantize);
    if (is_int_dtype(it.src->dtype)) {
      KV_TRY(w.write(it.out, it.src->data));
      ++sum.kept_tensors;
      continue;
    }
    KV_TRY(read_rows_parallel(src, *it.src, v));
    if (it.unpermute_heads > 0) {
      const int64_t hd = it.shape[0] / it.unpermute_heads;
      unpermute_gguf_qk_rows(v.data(), it.unpermute_heads, hd, it.shape[1]);
    }
    if (it.add != 0.f)
      for (auto& x : v) x += it.add;
    if (o.adjust) o.adjust(it.out, it.shape, v);
    if (it.quantize && o.format == QuantFormat::kFp8) {
      const int64_t R = it.shape[0], C = it.shape[1], B = kFp8WeightBlock;
      std::vector<uint8_t> codes(size_t(R * C));
      std::vector<float> scales(size_t(((R + B - 1) / B) * ((C + B - 1) / B)));
      fp8_block_quantize(v.data(), R, C, B, codes.data(), scales.data());
      KV_TRY(w.write(it.out, as_bytes(codes)));
      KV_TRY(w.write(it.out + "_scale", as_bytes(scales)));
      sum.quantized_int4_bytes += codes.size() + scales.size() * 4;
      std::vector<float> back(v.size());
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          back[size_t(r * C + c)] = fp8_e4m3_to_f32(codes[size_t(r * C + c)]) *
                                    scales[size_t((r / B) * ((C + B - 1) / B) + c / B)];
      const QuantError qe = quant_error(v.data(), back.data(), int64_t(v.size()));
      sum.max_rel_rms = std::max(sum.max_rel_rms, qe.rel_rms);
      rel_rms_sum += qe.rel_rms;
      sum.quantized_bf16_bytes += uint64_t(R * C) * 2;
      ++sum.quantized_tensors;
    } else if (it.quantize) {
      std::optional<Int4Weight> custom;
      if (o.quantize_int4) {
        auto c = o.quantize_int4(it.out, it.shape, v);
        if (!c) return c.error();
        custom = std::move(*c);
      }
      const Int4Weight q = custom ? std::move(*custom)
                                  : rtn_quantize(v.data(), it.shape[0], it.shape[1], o.group_size,
                                                 o.asymmetric);
      const std::string base = it.out.substr(0, it.out.size() - 7);
      for (const auto& td : int4_weight_tensors(base, q)) {
        KV_TRY(w.write(td.spec.name, td.bytes));
        sum.quantized_int4_bytes += td.bytes.size();
      }
      std::vector<float> back(v.size());
      dequantize(q, back.data());
      const QuantError qe = quant_error(v.data(), back.data(), int64_t(v.size()));
      sum.max_rel_rms = std::max(sum.max_rel_rms, qe.rel_rms);
      rel_rms_sum += qe.rel_rms;
      sum.quantized_bf16_bytes += uint64_t(it.shape[0] * it.shape[1]) * 2;
      ++sum.quantized_tensors;
    } else if (it.out_dtype == DType::F32) {
      KV_TRY(w.write(it.out, as_bytes(v)));
      ++sum.kept_tensors;
    } else {
      std::vector<uint16_t> b(v.size());
      parallel_for(int64_t(v.size()), 1 << 16, [&](int64_t s, int64_t e) {
        for (int64_t k = s; k < e; ++k) b[size_t(k)] = f32_to_bf16(v[size_t(k)]);
      });
      KV_TRY(w.write(it.out, as_bytes(b)));
      ++sum.kept_tensors;
    }
  }
  KV_TRY(w.finish());
  if (sum.quantized_tensors > 0) sum.mean_rel_rms = rel_rms_sum / double(sum.quantized_tensors);
  return {};
}

// Copies a safetensors input's tokenizer and generation files that exist
// into `out`, adding each to files.
Result<void> copy_tokenizer_files(const fs::path& in_dir, const fs::path& out,
                                  std::vector<std::string>& files) {
  std::error_code ec;
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "generation_config.json", "chat_template.jinja", "tokenizer.model", "tokenizer.gguf"}) {
    if (!fs::exists(in_dir / f)) continue;
    fs::copy_file(in_dir / f, out / f, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error((in_dir / f).string() + ": cannot copy: " + ec.message());
    files.push_back(f);
  }
  return {};
}

}  // namespace

nlohmann::json QuantizeSummary::to_json() const {
  return {{"input_bytes", input_bytes},
          {"output_bytes", output_bytes},
          {"quantized_tensors", quantized_tensors},
          {"kept_tensors", kept_tensors},
          {"quantized_bf16_bytes", quantized_bf16_bytes},
          {"format", format},
          {"quantized_int4_bytes", quantized_int4_bytes},
          {"quantized_ratio", quantized_int4_bytes ? double(quantized_bf16_bytes) / double(quantized_int4_bytes) : 0.0},
          {"mean_rel_rms_error", mean_rel_rms},
          {"max_rel_rms_error", max_rel_rms},
          {"ignore", ignore},
          {"warnings", warnings},
          {"files", files}};
}

Result<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& o) {
  QuantizeSummary sum;
  if (o.group_size <= 0) return make_error("quantize: group size must be positive");
  auto keep = compile_keep_patterns(o.keep);
  if (!keep) return keep.error();

  std::error_code ec;
  const bool is_dir = fs::is_directory(o.in, ec);
  const bool gguf = !is_dir && ends_with(o.in, ".gguf");
  auto src_r = open_tensor_source(o.in);
  if (!src_r) return src_r.error();
  const TensorSource& src = **src_r;

  InputConfig in;
  KV_TRY(read_input_config(o, is_dir, gguf, in));

  // Plan every output tensor.
  auto planned = plan_items(src, o, gguf, in);
  if (!planned) return planned.error();
  std::vector<Item>& items = *planned;
  std::vector<TensorSpec> specs = plan_specs(items, o, *keep, sum);

  fs::create_directories(o.out, ec);
  if (ec) return make_error(o.out + ": cannot create directory: " + ec.message());
  // The input stays mapped while the output is written: never the same directory.
  const fs::path src_dir = gguf ? fs::path(o.in).parent_path() : in.in_dir;
  if (!gguf && fs::equivalent(src_dir.empty() ? fs::path(".") : src_dir, o.out, ec))
    return make_error(o.out + ": is the input directory; write the quantized checkpoint elsewhere");
  auto wr = SafetensorsWriter::create(o.out, std::move(specs), o.max_shard_bytes);
  if (!wr) return wr.error();
  SafetensorsWriter& w = *wr;

  KV_TRY(write_tensors(src, items, o, w, sum));
  sum.files = w.files();
  if (w.files().size() > 1) sum.files.push_back("model.safetensors.index.json");
  sum.output_bytes = w.total_bytes();
  sum.input_bytes = input_bytes(o.in);

  Int4Scheme scheme;
  scheme.group_size = o.group_size;
  scheme.symmetric = !o.asymmetric;
  scheme.ignore = sum.ignore;
  // A checkpoint with nothing quantized (everything kept) is a plain BF16 one.
  sum.format = o.format == QuantFormat::kFp8 ? "fp8" : "int4";
  if (sum.quantized_tensors > 0)
    in.config["quantization_config"] = o.format == QuantFormat::kFp8
                                           ? fp8_quantization_config_json(sum.ignore)
                                           : quantization_config_json(scheme);
  else
    in.config.erase("quantization_config");
  KV_TRY(write_text(fs::path(o.out) / "config.json", in.config.dump(2) + "\n"));
  sum.files.push_back("config.json");

  if (gguf) {
    KV_TRY(write_gguf_tokenizer(*in.g, o.out, sum.files));
  } else {
    KV_TRY(copy_tokenizer_files(in.in_dir, o.out, sum.files));
  }
  return sum;
}

}  // namespace kvant
