// Reading checks every sibling's dtype and shape against weight_shape before
// touching data, then that every padding nibble is 0 (the reference packer
// pads with 0): a file that breaks any rule is refused with the tensor named.
// Zero points pack along dim 0: word (R, g) holds zero[8R + i, g] + 8 at bits
// [4i, 4i+4), so a column of eight consecutive rows shares a word.
#include "io/compressed_tensors.h"

#include <cstring>

#include "core/check.h"
#include "numerics/bf16.h"
#include "numerics/int4.h"

namespace kvant {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::vector<int32_t> words_of(const TensorRef& t) {
  std::vector<int32_t> w(t.data.size() / 4);
  if (!w.empty()) std::memcpy(w.data(), t.data.data(), w.size() * 4);
  return w;
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Zero points [rows, groups] <-> words [ceil(rows/8), groups], packed along rows.
std::vector<int32_t> pack_zero_rows(const std::vector<int8_t>& z, int64_t rows, int64_t groups) {
  const int64_t pr = int64_t(int4_words_for(size_t(rows)));
  std::vector<int32_t> out(size_t(pr * groups), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int v = z[size_t(r * groups + g)];
      KV_CHECK(v >= kInt4Min && v <= kInt4Max);
      auto& w = out[size_t((r / 8) * groups + g)];
      w = int32_t(uint32_t(w) | (uint32_t(v + kInt4Offset) << (4 * (r % 8))));
    }
  return out;
}

}  // namespace

Result<std::optional<Int4Scheme>> parse_quantization_config(const nlohmann::json& cfg) {
  if (!cfg.is_object() || !cfg.contains("quantization_config") || cfg["quantization_config"].is_null())
    return std::optional<Int4Scheme>();
  const auto& q = cfg["quantization_config"];
  auto bad = [](const std::string& m) { return make_error("quantization_config: " + m); };
  if (!q.is_object()) return bad("not an object");
  const std::string method = q.value("quant_method", std::string("(none)"));
  if (method != "compressed-tensors")
    return bad("quant_method is \"" + method + "\"; kvant runs only compressed-tensors pack-quantized INT4");
  const std::string format = q.contains("format") && q["format"].is_string() ? q["format"].get<std::string>() : "";
  const std::string status = q.contains("quantization_status") && q["quantization_status"].is_string()
                                 ? q["quantization_status"].get<std::string>() : "compressed";
  if (status != "compressed")
    return bad("quantization_status is \"" + status + "\"; only compressed checkpoints hold packed weights");
  if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty())
    return bad("no config_groups");
  std::optional<Int4Scheme> out;
  for (auto& [gkey, g] : q["config_groups"].items()) {
    // A named copy: clang 14 cannot capture a structured binding.
    const std::string gname = gkey;
    auto gbad = [&](const std::string& m) { return bad("config_groups." + gname + ": " + m); };
    if (!g.is_object()) return gbad("not an object");
    const std::string gformat = g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : format;
    if (gformat != "pack-quantized")
      return gbad("format is \"" + gformat + "\"; kvant reads pack-quantized");
    for (const char* k : {"input_activations", "output_activations"})
      if (g.contains(k) && !g[k].is_null())
        return gbad(std::string(k) + " are quantized; kvant runs weight-only (W4A16) schemes");
    if (!g.contains("weights") || !g["weights"].is_object()) return gbad("no weights scheme");
    const auto& w = g["weights"];
    const int bits = w.value("num_bits", 0);
    const std::string type = w.value("type", std::string("int"));
    const std::string strategy = w.value("strategy", std::string("(none)"));
    if (bits != 4 || type != "int")
      return gbad(std::to_string(bits) + "-bit " + type + " weights; kvant runs 4-bit int");
    if (strategy != "group") return gbad("strategy \"" + strategy + "\"; kvant runs group-wise scales");
    if (w.contains("dynamic") && w["dynamic"].is_boolean() && w["dynamic"].get<bool>())
      return gbad("dynamic weight quantization is not a stored format");
    if (w.contains("actorder") && w["actorder"].is_string() && w["actorder"] == "group")
      return gbad("actorder \"group\" needs weight_g_idx, which kvant does not read");
    if (!w.contains("group_size") || !w["group_size"].is_number_integer() || w["group_size"].get<int64_t>() <= 0)
      return gbad("group_size missing or not a positive integer");
    Int4Scheme s;
    s.group_size = int(w["group_size"].get<int64_t>());
    s.symmetric = w.value("symmetric", true);
    if (out && (out->group_size != s.group_size || out->symmetric != s.symmetric))
      return gbad("differs from another group (group size or symmetry); kvant runs one scheme");
    out = s;
  }
  if (q.contains("ignore") && q["ignore"].is_array())
    for (auto& e : q["ignore"])
      if (e.is_string()) out->ignore.push_back(e.get<std::string>());
  return out;
}

nlohmann::json quantization_config_json(const Int4Scheme& s) {
  nlohmann::ordered_json w = {{"num_bits", 4},        {"type", "int"},
                              {"symmetric", s.symmetric}, {"strategy", "group"},
                              {"group_size", s.group_size}, {"dynamic", false},
                              {"actorder", nullptr},  {"observer", "minmax"}};
  nlohmann::ordered_json g = {{"targets", {"Linear"}},
                              {"weights", w},
                              {"input_activations", nullptr},
                              {"output_activations", nullptr}};
  nlohmann::ordered_json q = {{"quant_method", "compressed-tensors"},
                              {"format", "pack-quantized"},
                              {"quantization_status", "compressed"},
                              {"config_groups", {{"group_0", g}}},
                              {"ignore", s.ignore},
                              {"kv_cache_scheme", nullptr}};
  return nlohmann::json::parse(q.dump());
}

bool is_fp8_quantization_config(const nlohmann::json& cfg) {
  if (!cfg.is_object() || !cfg.contains("quantization_config")) return false;
  const auto& q = cfg["quantization_config"];
  if (!q.is_object()) return false;
  const std::string method = q.value("quant_method", std::string());
  if (method == "fp8") return true;
  if (method != "compressed-tensors" || !q.contains("config_groups") ||
      !q["config_groups"].is_object() || q["config_groups"].empty())
    return false;
  for (const auto& [k, g] : q["config_groups"].items()) {
    if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object()) return false;
    const auto& w = g["weights"];
    if (w.value("num_bits", 0) != 8 || w.value("type", std::string()) != "float") return false;
  }
  return true;
}

nlohmann::json fp8_quantization_config_json(const std::vector<std::string>& ignore) {
  nlohmann::ordered_json w = {{"num_bits", 8},          {"type", "float"},
                              {"symmetric", true},      {"strategy", "block"},
                              {"block_structure", {128, 128}}, {"group_size", nullptr},
                              {"dynamic", false},       {"observer", "minmax"}};
  nlohmann::ordered_json g = {{"targets", {"Linear"}},
                              {"weights", w},
                              {"input_activations", nullptr},
                              {"output_activations", nullptr},
                              {"format", "float-quantized"}};
  nlohmann::ordered_json q = {{"quant_method", "compressed-tensors"},
                              {"format", "float-quantized"},
                              {"quantization_status", "compressed"},
                              {"config_groups", {{"group_0", g}}},
                              {"ignore", ignore},
                              {"kv_cache_scheme", nullptr}};
  return nlohmann::json::parse(q.dump());
}

bool has_int4_weight(const TensorSource& src, const std::string& base) {
  return src.find(base + ".weight_packed") != nullptr;
}

Result<Int4Weight> read_int4_weight(const TensorSource& src, const std::string& base) {
  const std::string where = src.path() + ": ";
  auto need = [&](const std::string& suffix) -> Result<const TensorRef*> {
    const TensorRef* t = src.find(base + suffix);
    if (!t) return make_error(where + "missing tensor " + base + suffix + " (INT4 weight " + base + ")");
    return t;
  };
  auto packed = need(".weight_packed");
  if (!packed) return packed.error();
  auto shape_t = need(".weight_shape");
  if (!shape_t) return shape_t.error();
  auto scale_t = need(".weight_scale");
  if (!scale_t) return scale_t.error();
  const TensorRef& P = **packed;
  const TensorRef& S = **shape_t;
  const TensorRef& Sc = **scale_t;
  auto bad = [&](const TensorRef& t, const std::string& m) {
    return make_error(where + "tensor " + t.name + " " + m);
  };

  if (S.dtype != DType::I32 && S.dtype != DType::I64)
    return bad(S, "has dtype " + std::string(dtype_name(S.dtype)) + ", expected I32 or I64");
  if (S.shape != std::vector<int64_t>{2}) return bad(S, "has shape " + shape_str(S.shape) + ", expected [2]");
  int64_t rc[2];
  for (int i = 0; i < 2; ++i) {
    if (S.dtype == DType::I32) {
      int32_t v;
      std::memcpy(&v, S.data.data() + 4 * i, 4);
      rc[i] = v;
    } else {
      std::memcpy(&rc[i], S.data.data() + 8 * i, 8);
    }
  }
  const int64_t rows = rc[0], cols = rc[1];
  if (rows <= 0 || cols <= 0 || rows > (int64_t(1) << 31) || cols > (int64_t(1) << 31))
    return bad(S, "holds {" + std::to_string(rows) + ", " + std::to_string(cols) + "}, not a valid matrix shape");

  const int64_t pw = int64_t(int4_words_for(size_t(cols)));
  if (P.dtype != DType::I32)
    return bad(P, "has dtype " + std::string(dtype_name(P.dtype)) + ", expected I32");
  if (P.shape != std::vector<int64_t>{rows, pw})
    return bad(P, "has shape " + shape_str(P.shape) + ", expected " + shape_str({rows, pw}) +
                      " for a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] weight");

  if (Sc.dtype != DType::BF16 && Sc.dtype != DType::F16 && Sc.dtype != DType::F32)
    return bad(Sc, "has dtype " + std::string(dtype_name(Sc.dtype)) + ", expected BF16, F16 or F32");
  if (Sc.shape.size() != 2 || Sc.shape[0] != rows || Sc.shape[1] <= 0)
    return bad(Sc, "has shape " + shape_str(Sc.shape) + ", expected [" + std::to_string(rows) + ", cols/group]");
  const int64_t groups = Sc.shape[1];
  // The group size: cols / groups when that divides; else the last group of
  // each row is short and the size is the multiple of 32 that gives
  // ceil(cols / group) == groups (576 columns in 5 groups: 128).
  int64_t group = cols / groups;
  if (cols % groups != 0) {
    group = ((cols + groups - 1) / groups + 31) / 32 * 32;
    if ((cols + group - 1) / group != groups)
      return bad(Sc, "has " + std::to_string(groups) + " groups per row, which fits no group size for " +
                         std::to_string(cols) + " columns");
  }

  Int4Weight w;
  w.rows = rows;
  w.cols = cols;
  w.group = group;

  const TensorRef* Z = src.find(base + ".weight_zero_point");
  const int64_t zr = int64_t(int4_words_for(size_t(rows)));
  if (Z) {
    if (Z->dtype != DType::I32)
      return bad(*Z, "has dtype " + std::string(dtype_name(Z->dtype)) + ", expected I32");
    if (Z->shape != std::vector<int64_t>{zr, groups})
      return bad(*Z, "has shape " + shape_str(Z->shape) + ", expected " + shape_str({zr, groups}) +
                         " (zero points packed eight rows per word)");
  }

  const auto words = words_of(P);
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t last = uint32_t(words[size_t(r * pw + pw - 1)]);
    const int used = int((cols - 1) % 8 + 1);
    if (used < 8 && (last >> (4 * used)) != 0)
      return bad(P, "row " + std::to_string(r) + " has non-zero padding nibbles after column " +
                        std::to_string(cols - 1));
  }
  w.q.resize(size_t(rows * cols));
  unpack_int4_rows(words, size_t(rows), size_t(cols), w.q);

  w.scale.resize(size_t(rows * groups));
  KV_TRY(src.read_f32(Sc, w.scale));

  if (Z) {
    const auto zw = words_of(*Z);
    const int used = int((rows - 1) % 8 + 1);
    for (int64_t g = 0; g < groups; ++g) {
      const uint32_t last = uint32_t(zw[size_t((zr - 1) * groups + g)]);
      if (used < 8 && (last >> (4 * used)) != 0)
        return bad(*Z, "column " + std::to_string(g) + " has non-zero padding nibbles after row " +
                           std::to_string(rows - 1));
    }
    w.zero.resize(size_t(rows * groups));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const uint32_t word = uint32_t(zw[size_t((r / 8) * groups + g)]);
        w.zero[size_t(r * groups + g)] = int8_t(int((word >> (4 * (r % 8))) & 0xfu) - kInt4Offset);
      }
  }
  return w;
}

std::vector<TensorSpec> int4_weight_specs(const std::string& base, int64_t rows, int64_t cols,
                                          int64_t group, bool asymmetric) {
  const int64_t groups = (cols + group - 1) / group;  // the last one may be short
  std::vector<TensorSpec> s = {
      {base + ".weight_packed", DType::I32, {rows, int64_t(int4_words_for(size_t(cols)))}},
      {base + ".weight_scale", DType::BF16, {rows, groups}},
      {base + ".weight_shape", DType::I32, {2}},
  };
  if (asymmetric)
    s.push_back({base + ".weight_zero_point", DType::I32, {int64_t(int4_words_for(size_t(rows))), groups}});
  return s;
}

uint64_t int4_weight_bytes(int64_t rows, int64_t cols, int64_t group, bool asymmetric) {
  uint64_t n = 0;
  for (auto& s : int4_weight_specs("", rows, cols, group, asymmetric)) n += s.nbytes();
  return n;
}

std::vector<TensorData> int4_weight_tensors(const std::string& base, const Int4Weight& w) {
  KV_CHECK(w.rows > 0 && w.cols > 0 && w.group > 0);
  const int64_t groups = (w.cols + w.group - 1) / w.group;
  KV_CHECK_EQ(w.q.size(), size_t(w.rows * w.cols));
  KV_CHECK_EQ(w.scale.size(), size_t(w.rows * groups));
  KV_CHECK(w.zero.empty() || w.zero.size() == w.scale.size());
  auto specs = int4_weight_specs(base, w.rows, w.cols, w.group, !w.zero.empty());
  std::vector<TensorData> out;
  std::vector<int32_t> packed(size_t(w.rows) * int4_words_for(size_t(w.cols)));
  pack_int4_rows(w.q, size_t(w.rows), size_t(w.cols), packed);
  out.push_back({specs[0], bytes_of(packed)});
  std::vector<uint16_t> sc(w.scale.size());
  for (size_t i = 0; i < sc.size(); ++i) {
    sc[i] = f32_to_bf16(w.scale[i]);
    KV_CHECK(bf16_to_f32(sc[i]) == w.scale[i] || w.scale[i] != w.scale[i]);
  }
  out.push_back({specs[1], bytes_of(sc)});
  const std::vector<int32_t> shape = {int32_t(w.rows), int32_t(w.cols)};
  out.push_back({specs[2], bytes_of(shape)});
  if (!w.zero.empty()) out.push_back({specs[3], bytes_of(pack_zero_rows(w.zero, w.rows, groups))});
  return out;
}

}  // namespace kvant
