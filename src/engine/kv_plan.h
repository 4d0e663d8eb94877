// KV capacity planning for `kvant plan`: turns any Hugging Face config.json
// (including architectures kvant cannot run, such as DeepSeek-V3 / Kimi K2
// MLA models) into a KvGeometry per KV dtype and reports what a byte budget
// holds on one tensor-parallel rank. It owns the config -> cache-shape rules
// (GQA heads, head_dim defaults, MLA latent width, text_config nesting) and
// the byte-size parser for budgets. It does not allocate pages, load weights
// or print anything: the page arithmetic is kvcache/kv_layout's, and the
// command in cli/ formats the result.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "kvcache/kv_layout.h"

namespace kvant {

// What a model's config says about its KV cache, before any dtype or
// parallelism is chosen.
struct KvCacheShape {
  std::string architecture;  // architectures[0] or model_type; may be empty
  int64_t layers = 0;
  int64_t kv_heads = 0;            // 1 for MLA
  int64_t head_dim = 0;            // per-head width; the latent width for MLA
  bool mla = false;                // one latent row per token and layer, shared as K and V
  int64_t kv_lora_rank = 0;        // MLA only
  int64_t qk_rope_head_dim = 0;    // MLA only
  int64_t index_dim = 0;           // DSA: the indexer's key per token and layer (BF16), or 0
  std::vector<std::string> notes;  // what the estimate leaves out, for the reader
};

// Reads the cache shape from a parsed config.json. Fields are looked up in a
// nested "text_config" first (multimodal wrappers), then at the top level.
// Errors name the missing or malformed field.
Result<KvCacheShape> kv_cache_shape_from_config(const nlohmann::json& config);

// Parses a byte count: a whole number ("1073741824") or a number with a unit:
// B, KB/MB/GB/TB/PB (powers of 1000) or KiB/MiB/GiB/TiB/PiB (powers of 1024),
// case-insensitive; fractions are allowed with a unit ("1.5TiB") and round
// down to whole bytes. Bare K/M/G/T are rejected as ambiguous. The result is
// positive and fits in int64.
Result<int64_t> parse_byte_size(std::string_view text);

struct KvPlanOptions {
  int64_t memory_bytes = 0;                       // budget on each rank
  int64_t tp = 1;                                 // tensor-parallel ranks
  std::vector<KvDType> dtypes;                    // empty: bf16, fp8_e4m3 and fp8_e5m2
  KvScaleMode fp8_scales = KvScaleMode::kStatic;  // BF16 always uses kNone
  int64_t page_tokens = 16;
};

// One KV dtype's capacity on one rank.
struct KvPlanRow {
  KvDType dtype = KvDType::kBf16;
  KvScaleMode scales = KvScaleMode::kNone;
  double bytes_per_token = 0;           // arena cost per token on one rank, padding included
  int64_t payload_bytes_per_token = 0;  // K/V values per token, all layers, one rank
  int64_t scale_bytes_per_token = 0;    // dynamic per-token scales; 0 otherwise
  int64_t static_scale_bytes = 0;       // static per-(layer, head) scales, held outside the arena
  int64_t page_bytes = 0;
  int64_t pages = 0;
  int64_t tokens = 0;
  double ratio_vs_bf16 = 0;  // tokens / BF16 tokens in the same budget
};

struct KvPlan {
  KvCacheShape shape;
  KvPlanOptions options;
  int64_t kv_heads_per_rank = 0;  // ceil(kv_heads / tp); the whole latent for MLA
  bool replicated = false;        // each rank holds the full cache row (MLA, or tp > kv_heads)
  std::vector<KvPlanRow> rows;    // one per requested dtype, in request order
};

// Computes the plan; fails on a bad option (tp < 1, page_tokens out of range,
// a budget too small for one page is not an error: it gives 0 pages).
Result<KvPlan> make_kv_plan(const KvCacheShape& shape, const KvPlanOptions& options);

// Machine-readable form of a plan (one JSON object).
nlohmann::json kv_plan_to_json(const KvPlan& plan);

// Human-readable form: a short header and one table row per dtype.
std::string kv_plan_to_text(const KvPlan& plan);

}  // namespace kvant
