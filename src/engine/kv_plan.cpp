// Config -> KV cache shape, byte-size parsing and per-dtype capacity (see
// kv_plan.h). Page sizes come from make_kv_layout so the plan and the page
// pool can never disagree about what a token costs.
#include "engine/kv_plan.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>

namespace kvant {
namespace {

using nlohmann::json;

// Keeps the latent sum and every product in make_kv_layout far from overflow.
constexpr int64_t kMaxConfigDim = int64_t(1) << 20;
constexpr int64_t kMaxTp = 4096;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The config's fields, text_config first: multimodal wrappers keep the
// language model's sizes there and sometimes leave stale copies at the top.
class ConfigView {
 public:
  explicit ConfigView(const json& top) : top_(top) {
    auto it = top.find("text_config");
    if (it != top.end() && it->is_object()) text_ = &*it;
  }

  const json* find(std::string_view name) const {
    for (const json* obj : {text_, &top_}) {
      if (obj == nullptr) continue;
      auto it = obj->find(name);
      if (it != obj->end() && !it->is_null()) return &*it;
    }
    return nullptr;
  }

  // The first of `names` that is present; absent -> nullopt. Present but not
  // a positive whole number in range -> an error naming the field.
  Result<std::optional<int64_t>> positive_int(std::initializer_list<std::string_view> names) const {
    for (std::string_view name : names) {
      const json* v = find(name);
      if (v == nullptr) continue;
      double d = 0;
      if (v->is_number_integer()) {
        // Unsigned values above int64 arrive as number_unsigned; get<double> is exact enough
        // for the range check below.
        d = v->get<double>();
      } else if (v->is_number_float()) {
        d = v->get<double>();
        if (d != std::floor(d)) d = -1;
      } else {
        return make_error("config.json: field '" + std::string(name) +
                          "' must be a positive integer, got " + v->dump());
      }
      if (!(d >= 1 && d <= double(kMaxConfigDim)))
        return make_error("config.json: field '" + std::string(name) +
                          "' must be a positive integer up to 2^20, got " + v->dump());
      return std::optional<int64_t>(int64_t(d));
    }
    return std::optional<int64_t>();
  }

  Result<int64_t> required_int(std::initializer_list<std::string_view> names) const {
    auto r = positive_int(names);
    if (!r) return r.error();
    if (!r.value())
      return make_error("config.json: missing field '" + std::string(*names.begin()) + "'");
    return **r;
  }

 private:
  const json& top_;
  const json* text_ = nullptr;
};

std::string architecture_of(const ConfigView& c) {
  if (const json* a = c.find("architectures");
      a && a->is_array() && !a->empty() && (*a)[0].is_string())
    return (*a)[0].get<std::string>();
  if (const json* m = c.find("model_type"); m && m->is_string()) return m->get<std::string>();
  return "";
}

// Architectures whose attention is MLA: a config of theirs without
// kv_lora_rank is broken, not dense.
bool is_mla_architecture(const ConfigView& c, const std::string& arch) {
  std::string names = lower(arch);
  if (const json* m = c.find("model_type"); m && m->is_string())
    names += " " + lower(m->get<std::string>());
  for (const char* key : {"deepseekv2", "deepseekv3", "deepseek_v2", "deepseek_v3", "deepseekv32",
                          "deepseek_v32", "kimik2", "kimi_k2", "glmmoedsa", "glm_moe_dsa"})
    if (names.find(key) != std::string::npos) return true;
  return false;
}

void add_common_notes(const ConfigView& c, KvCacheShape& s) {
  if (auto n = c.positive_int({"num_nextn_predict_layers"}); n && n.value())
    s.notes.push_back(std::to_string(**n) +
                      " multi-token-prediction layer(s) not counted (only speculative decoding "
                      "with --mtp uses the first; kvant plan --mtp counts it)");
  if (auto n = c.positive_int({"index_head_dim"}); n && n.value() && s.mla) {
    // kvant keeps the indexer's keys in the page, BF16, beside the latent.
    s.index_dim = **n;
    s.notes.push_back("the sparse-attention indexer's keys (index_head_dim " + std::to_string(**n) +
                      " BF16 values per token and layer) are counted, in every layer");
  }
  if (const json* lt = c.find("layer_types"); lt && lt->is_array())
    s.notes.push_back(
        "config lists layer_types; every layer is counted as full attention "
        "(sliding-window or linear layers would need less)");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string group_digits(int64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  size_t i = 0;
  if (!digits.empty() && digits[0] == '-') out += digits[i++];
  for (; i < digits.size(); ++i) {
    out += digits[i];
    const size_t left = digits.size() - i - 1;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out;
}

std::string human_bytes(int64_t b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace

Result<KvCacheShape> kv_cache_shape_from_config(const json& config) {
  if (!config.is_object()) return make_error("config.json: expected a JSON object");
  ConfigView c(config);
  KvCacheShape s;
  s.architecture = architecture_of(c);
  auto layers = c.required_int({"num_hidden_layers", "n_layer", "num_layers"});
  if (!layers) return layers.error();
  s.layers = *layers;

  auto kv_lora = c.positive_int({"kv_lora_rank"});
  if (!kv_lora) return kv_lora.error();
  if (kv_lora.value() || is_mla_architecture(c, s.architecture)) {
    // MLA caches the compressed latent (kv_lora_rank) plus the decoupled rope
    // key (qk_rope_head_dim) once per token and layer; both K and V are
    // reconstructed from that one row.
    if (!kv_lora.value())
      return make_error("config.json: missing field 'kv_lora_rank' (" + s.architecture +
                        " uses MLA)");
    auto rope = c.required_int({"qk_rope_head_dim"});
    if (!rope) return rope.error();
    s.mla = true;
    s.kv_lora_rank = **kv_lora;
    s.qk_rope_head_dim = *rope;
    s.kv_heads = 1;
    s.head_dim = s.kv_lora_rank + s.qk_rope_head_dim;
    add_common_notes(c, s);
    return s;
  }

  auto heads = c.positive_int({"num_attention_heads", "n_head", "num_heads"});
  if (!heads) return heads.error();
  auto kv_heads = c.positive_int({"num_key_value_heads", "num_kv_heads", "n_head_kv"});
  if (!kv_heads) return kv_heads.error();
  if (kv_heads.value()) {
    s.kv_heads = **kv_heads;
  } else if (const json* mq = c.find("multi_query"); mq && mq->is_boolean() && mq->get<bool>()) {
    s.kv_heads = 1;
  } else if (heads.value()) {
    s.kv_heads = **heads;
  } else {
    return make_error(
        "config.json: missing field 'num_key_value_heads' (and no 'num_attention_heads' to "
        "default to)");
  }

  auto head_dim = c.positive_int({"head_dim"});
  if (!head_dim) return head_dim.error();
  if (head_dim.value()) {
    s.head_dim = **head_dim;
  } else {
    auto hidden = c.positive_int({"hidden_size", "n_embd", "d_model"});
    if (!hidden) return hidden.error();
    if (!hidden.value())
      return make_error(
          "config.json: missing field 'head_dim' (and no 'hidden_size' to derive it)");
    if (!heads.value())
      return make_error(
          "config.json: missing field 'head_dim' (and no 'num_attention_heads' to derive it)");
    if (**hidden % **heads != 0)
      return make_error("config.json: hidden_size " + std::to_string(**hidden) +
                        " is not a multiple of num_attention_heads " + std::to_string(**heads) +
                        "; give head_dim");
    s.head_dim = **hidden / **heads;
  }
  if (heads.value() && **heads % s.kv_heads != 0)
    return make_error("config.json: num_attention_heads " + std::to_string(**heads) +
                      " is not a multiple of num_key_value_heads " + std::to_string(s.kv_heads));
  add_common_notes(c, s);
  return s;
}

Result<int64_t> parse_byte_size(std::string_view text) {
  const std::string shown = "'" + std::string(text) + "'";
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string_view s = text.substr(b, e - b);
  if (s.empty()) return make_error("memory size: empty value");
  if (s[0] == '-') return make_error("memory size " + shown + ": must be positive");

  // Digits, then optionally '.' and digits; kept as one decimal mantissa so
  // "1.5TiB" is computed exactly, without binary floating point.
  size_t i = 0;
  unsigned __int128 mantissa = 0;
  int frac_digits = 0, digits = 0, significant = 0;
  bool dot = false;
  for (; i < s.size(); ++i) {
    char ch = s[i];
    if (ch >= '0' && ch <= '9') {
      // 20 significant digits keep mantissa * unit (<= 2^50) inside 128 bits.
      if (mantissa != 0 || ch != '0') ++significant;
      if (significant > 20 || frac_digits >= 30)
        return make_error("memory size " + shown + ": too many digits");
      mantissa = mantissa * 10 + unsigned(ch - '0');
      ++digits;
      if (dot) ++frac_digits;
    } else if (ch == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (digits == 0)
    return make_error("memory size " + shown + ": expected a number such as 2GiB, 512MiB or 80GB");
  if (dot && frac_digits == 0) return make_error("memory size " + shown + ": no digits after '.'");
  size_t u = i;
  while (u < s.size() && s[u] == ' ') ++u;
  const std::string unit = lower(s.substr(u));

  struct Unit {
    const char* name;
    unsigned __int128 mult;
  };
  const unsigned __int128 k10 = 1000, k2 = 1024;
  const Unit units[] = {
      {"", 1},
      {"b", 1},
      {"kb", k10},
      {"mb", k10 * k10},
      {"gb", k10 * k10 * k10},
      {"tb", k10 * k10 * k10 * k10},
      {"pb", k10 * k10 * k10 * k10 * k10},
      {"kib", k2},
      {"mib", k2 * k2},
      {"gib", k2 * k2 * k2},
      {"tib", k2 * k2 * k2 * k2},
      {"pib", k2 * k2 * k2 * k2 * k2},
  };
  const Unit* found = nullptr;
  for (const Unit& x : units)
    if (unit == x.name) found = &x;
  if (found == nullptr) {
    if (unit == "k" || unit == "m" || unit == "g" || unit == "t" || unit == "p")
      return make_error("memory size " + shown + ": unit '" + std::string(s.substr(u)) +
                        "' is ambiguous; write " + std::string(s.substr(u)) +
                        "iB (powers of 1024) or " + std::string(s.substr(u)) +
                        "B (powers of 1000)");
    return make_error("memory size " + shown + ": unknown unit '" + std::string(s.substr(u)) +
                      "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  }
  if (dot && found->mult == 1)
    return make_error("memory size " + shown + ": a byte count without a unit must be whole");
  unsigned __int128 div = 1;
  for (int k = 0; k < frac_digits; ++k) div *= 10;
  const unsigned __int128 limit = uint64_t(std::numeric_limits<int64_t>::max());
  const unsigned __int128 bytes = mantissa * found->mult / div;
  if (bytes > limit) return make_error("memory size " + shown + ": too large (over 2^63 bytes)");
  if (bytes == 0) return make_error("memory size " + shown + ": must be at least one byte");
  return int64_t(bytes);
}

Result<KvPlan> make_kv_plan(const KvCacheShape& shape, const KvPlanOptions& o) {
  if (o.tp < 1 || o.tp > kMaxTp)
    return make_error("plan: --tp must be in [1, " + std::to_string(kMaxTp) + "], got " +
                      std::to_string(o.tp));
  if (o.memory_bytes < 1) return make_error("plan: the memory budget must be positive");
  if (o.fp8_scales != KvScaleMode::kStatic && o.fp8_scales != KvScaleMode::kDynamic)
    return make_error("plan: FP8 scales must be static or dynamic");

  KvPlan p;
  p.shape = shape;
  p.options = o;
  p.kv_heads_per_rank = shape.mla ? 1 : ceil_div(shape.kv_heads, o.tp);
  p.replicated = o.tp > 1 && (shape.mla || o.tp > shape.kv_heads);

  auto geometry = [&](KvDType d) {
    KvGeometry g;
    g.layers = shape.layers;
    g.kv_heads = p.kv_heads_per_rank;
    g.head_dim = shape.head_dim;
    g.dtype = d;
    g.page_tokens = o.page_tokens;
    g.scale_mode = d == KvDType::kBf16 ? KvScaleMode::kNone : o.fp8_scales;
    g.shared_kv = shape.mla;
    g.index_dim = shape.index_dim;
    return g;
  };
  // The BF16 pool is the yardstick for every ratio, requested or not.
  auto bf16 = make_kv_layout(geometry(KvDType::kBf16));
  if (!bf16) return make_error("plan: " + bf16.error().message);
  const int64_t bf16_tokens = kv_pages_for_budget(*bf16, o.memory_bytes) * o.page_tokens;

  const int64_t streams = shape.mla ? 1 : 2;
  std::vector<KvDType> dtypes = o.dtypes;
  if (dtypes.empty()) dtypes = {KvDType::kBf16, KvDType::kFp8E4m3, KvDType::kFp8E5m2};
  for (KvDType d : dtypes) {
    const KvGeometry g = geometry(d);
    auto layout = make_kv_layout(g);
    if (!layout) return make_error("plan: " + layout.error().message);
    KvPlanRow r;
    r.dtype = d;
    r.scales = g.scale_mode;
    r.bytes_per_token = kv_bytes_per_token(*layout);
    r.scale_bytes_per_token = g.scale_mode == KvScaleMode::kDynamic
                                  ? g.layers * streams * g.kv_heads * kKvScaleBytes
                                  : 0;
    r.payload_bytes_per_token = layout->payload_bytes_per_token - r.scale_bytes_per_token;
    r.static_scale_bytes = g.scale_mode == KvScaleMode::kStatic
                               ? g.layers * streams * g.kv_heads * int64_t(sizeof(float))
                               : 0;
    r.page_bytes = layout->page_bytes;
    r.pages = kv_pages_for_budget(*layout, o.memory_bytes);
    r.tokens = r.pages * o.page_tokens;
    r.ratio_vs_bf16 = bf16_tokens > 0 ? double(r.tokens) / double(bf16_tokens) : 0;
    p.rows.push_back(r);
  }
  return p;
}

json kv_plan_to_json(const KvPlan& p) {
  const KvCacheShape& s = p.shape;
  json j;
  j["architecture"] = s.architecture;
  j["attention"] = s.mla ? "mla" : "mha";
  j["layers"] = s.layers;
  j["kv_heads"] = s.kv_heads;
  j["kv_heads_per_rank"] = p.kv_heads_per_rank;
  j["head_dim"] = s.head_dim;
  if (s.mla) {
    j["kv_lora_rank"] = s.kv_lora_rank;
    j["qk_rope_head_dim"] = s.qk_rope_head_dim;
  }
  j["shared_kv"] = s.mla;
  j["tp"] = p.options.tp;
  j["replicated_per_rank"] = p.replicated;
  j["memory_bytes_per_rank"] = p.options.memory_bytes;
  j["page_tokens"] = p.options.page_tokens;
  j["notes"] = s.notes;
  json rows = json::array();
  for (const KvPlanRow& r : p.rows) {
    json x;
    x["kv_dtype"] = kv_dtype_name(r.dtype);
    x["scales"] = kv_scale_mode_name(r.scales);
    x["bytes_per_token_per_rank"] = r.bytes_per_token;
    x["bytes_per_token_all_ranks"] = r.bytes_per_token * double(p.options.tp);
    x["payload_bytes_per_token"] = r.payload_bytes_per_token;
    x["scale_bytes_per_token"] = r.scale_bytes_per_token;
    x["padding_bytes_per_token"] =
        r.bytes_per_token - double(r.payload_bytes_per_token + r.scale_bytes_per_token);
    x["static_scale_bytes"] = r.static_scale_bytes;
    x["page_bytes"] = r.page_bytes;
    x["pages"] = r.pages;
    x["tokens"] = r.tokens;
    if (r.ratio_vs_bf16 > 0)
      x["ratio_vs_bf16"] = r.ratio_vs_bf16;
    else
      x["ratio_vs_bf16"] = nullptr;
    rows.push_back(std::move(x));
  }
  j["dtypes"] = std::move(rows);
  return j;
}

std::string kv_plan_to_text(const KvPlan& p) {
  const KvCacheShape& s = p.shape;
  const int64_t tp = p.options.tp;
  std::string out;
  char buf[512];
  out += "model: " + (s.architecture.empty() ? std::string("(unnamed)") : s.architecture) + "\n";
  if (s.mla) {
    std::snprintf(buf, sizeof buf,
                  "cache: MLA latent, %lld layers x (kv_lora_rank %lld + qk_rope_head_dim %lld = "
                  "%lld values) per token, one row shared as K and V\n",
                  (long long)s.layers, (long long)s.kv_lora_rank, (long long)s.qk_rope_head_dim,
                  (long long)s.head_dim);
    if (s.index_dim > 0) {
      out += buf;
      std::snprintf(buf, sizeof buf,
                    "       plus the sparse-attention indexer's key, %lld BF16 values per token and "
                    "layer\n",
                    (long long)s.index_dim);
    }
  } else {
    std::snprintf(buf, sizeof buf,
                  "cache: K and V, %lld layers x %lld KV heads x head_dim %lld per token\n",
                  (long long)s.layers, (long long)s.kv_heads, (long long)s.head_dim);
  }
  out += buf;
  if (tp > 1) {
    if (s.mla)
      std::snprintf(buf, sizeof buf,
                    "tensor parallel: %lld ranks; the MLA latent is not split by heads, so every "
                    "rank holds a full copy of it\n",
                    (long long)tp);
    else if (p.replicated)
      std::snprintf(buf, sizeof buf,
                    "tensor parallel: %lld ranks > %lld KV heads; each rank holds 1 head, "
                    "replicated across ranks\n",
                    (long long)tp, (long long)s.kv_heads);
    else
      std::snprintf(buf, sizeof buf,
                    "tensor parallel: %lld ranks; KV heads split, %lld per rank (ceil(%lld / "
                    "%lld))\n",
                    (long long)tp, (long long)p.kv_heads_per_rank, (long long)s.kv_heads,
                    (long long)tp);
    out += buf;
  }
  out += "budget: " + group_digits(p.options.memory_bytes) + " bytes (" +
         human_bytes(p.options.memory_bytes) + ") per rank, pages of " +
         std::to_string(p.options.page_tokens) + " tokens\n";
  for (const std::string& n : s.notes) out += "note: " + n + "\n";
  out += "\n";
  std::snprintf(buf, sizeof buf, "%-9s %-8s %13s %13s %9s %9s %10s %14s %8s\n", "kv_dtype",
                "scales", "B/token/rank", "B/token/all", "payload", "scale_B", "pages", "tokens",
                "vs_bf16");
  out += buf;
  for (const KvPlanRow& r : p.rows) {
    char ratio[32];
    if (r.ratio_vs_bf16 > 0)
      std::snprintf(ratio, sizeof ratio, "%.2fx", r.ratio_vs_bf16);
    else
      std::snprintf(ratio, sizeof ratio, "-");
    std::snprintf(buf, sizeof buf, "%-9s %-8s %13s %13s %9s %9s %10s %14s %8s\n",
                  kv_dtype_name(r.dtype), kv_scale_mode_name(r.scales),
                  group_digits(int64_t(std::llround(r.bytes_per_token))).c_str(),
                  group_digits(int64_t(std::llround(r.bytes_per_token * double(tp)))).c_str(),
                  group_digits(r.payload_bytes_per_token).c_str(),
                  group_digits(r.scale_bytes_per_token).c_str(), group_digits(r.pages).c_str(),
                  group_digits(r.tokens).c_str(), ratio);
    out += buf;
  }
  bool padded = false, statics = false;
  for (const KvPlanRow& r : p.rows) {
    padded |= r.bytes_per_token != double(r.payload_bytes_per_token + r.scale_bytes_per_token);
    statics |= r.static_scale_bytes > 0;
  }
  out += "\nB/token/rank is the page arena's cost per token on one rank";
  out += padded ? " (pages are padded to 64-byte blocks, so it can exceed payload + scales)" : "";
  out += "; tokens = whole pages in the budget x page size.\n";
  if (statics) {
    for (const KvPlanRow& r : p.rows)
      if (r.static_scale_bytes > 0) {
        out += "static scales: " + group_digits(r.static_scale_bytes) +
               " bytes per rank, held outside the page arena.\n";
        break;
      }
  }
  return out;
}

}  // namespace kvant
