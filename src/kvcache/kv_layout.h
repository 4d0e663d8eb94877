// KV page geometry and the byte layout of one page: where each layer's K and
// V blocks and (dynamic mode) their scale arrays sit, how many bytes a page and
// a token cost, and how many pages fit in a byte budget. Pure arithmetic: no
// allocation of page memory, no knowledge of models (the caller turns a model
// config into a KvGeometry). Layout rules: docs/FORMATS.md, "KV cache pages and
// integrity tags".
#pragma once

#include <cstdint>

#include "core/result.h"
#include "numerics/kv_dtype.h"

namespace kvant {

// How FP8 values are scaled (stored code = fp8(x / scale), read value =
// decode(code) * scale). BF16 pages use kNone.
enum class KvScaleMode : uint8_t {
  kNone = 0,     // BF16 only
  kStatic = 1,   // per-(layer, head) FP32 scales fixed at pool construction
  kDynamic = 2,  // per-(token, head) FP32 scales, amax / max_finite, stored in the page
};

const char* kv_dtype_name(KvDType d);
const char* kv_scale_mode_name(KvScaleMode m);
int64_t kv_dtype_bytes(KvDType d);  // 2 or 1
// Largest finite value of the FP8 dtype (448 or 57344); 0 for BF16.
float kv_dtype_max_finite(KvDType d);

struct KvGeometry {
  int64_t layers = 0;
  int64_t kv_heads = 0;  // 1 for MLA
  int64_t head_dim = 0;  // per-head row width; the latent width (e.g. 512 + 64) for MLA
  KvDType dtype = KvDType::kBf16;
  int64_t page_tokens = 16;
  KvScaleMode scale_mode = KvScaleMode::kNone;
  // MLA: K and V are the same cached row. Only the K block (and K scales) is
  // stored; V accessors return the K block, so one scale serves both.
  bool shared_kv = false;
  // Sparse attention (GLM-5 DSA): the indexer's key per token and layer,
  // index_dim BF16 values in a block of its own (0: none).
  int64_t index_dim = 0;
};

// Every block starts on this boundary inside a page, and pages follow each
// other at page_bytes (a multiple of it), so a 64-byte-aligned arena gives
// cache-line-aligned blocks for the attention kernels.
inline constexpr int64_t kKvBlockAlign = 64;

// A dynamic scale is stored as BF16 (2 bytes): FP32's range, and rounded up
// when computed so that x / scale never exceeds the format's largest value.
// FP32 scales would cost 1.88x instead of 1.94x BF16 capacity on SmolLM2.
inline constexpr int64_t kKvScaleBytes = 2;

// Byte offsets inside one page. Layer l's K block starts at
// l * layer_bytes + k_offset, and so on. With shared_kv, v_offset == k_offset
// and v_scale_offset == k_scale_offset.
struct KvLayout {
  KvGeometry geometry;
  int64_t elem_bytes = 0;         // bytes per stored element
  int64_t row_elems = 0;          // kv_heads * head_dim, one token's K (or V)
  int64_t data_block_bytes = 0;   // [page_tokens, kv_heads, head_dim] elements, padded to 64
  int64_t scale_block_bytes = 0;  // [page_tokens, kv_heads] BF16, padded to 64; 0 unless dynamic
  int64_t k_offset = 0;
  int64_t v_offset = 0;
  int64_t k_scale_offset = 0;  // meaningful in dynamic mode only
  int64_t v_scale_offset = 0;
  int64_t index_offset = 0;       // DSA indexer keys [page_tokens, index_dim] BF16, when index_dim > 0
  int64_t index_block_bytes = 0;
  int64_t layer_bytes = 0;  // one layer's blocks, a multiple of 64
  int64_t page_bytes = 0;   // layers * layer_bytes
  // Bytes a token needs without padding: layers * (K + V rows + scales).
  // Equals page_bytes / page_tokens whenever no block needs padding (e.g.
  // page_tokens a multiple of 16).
  int64_t payload_bytes_per_token = 0;
};

// Validates the geometry (positive sizes, BF16 <=> kNone, FP8 => kStatic or
// kDynamic, page size within limits) and computes its layout.
Result<KvLayout> make_kv_layout(const KvGeometry& g);

// Whole pages that fit in `bytes` of arena (metadata outside the arena --
// refcounts, generations, free list, checksums: 21 bytes a page -- is not counted).
int64_t kv_pages_for_budget(const KvLayout& layout, int64_t bytes);

// What one token of capacity costs in arena bytes, padding included:
// page_bytes / page_tokens (exact in double for any realistic size).
inline double kv_bytes_per_token(const KvLayout& layout) {
  return double(layout.page_bytes) / double(layout.geometry.page_tokens);
}

}  // namespace kvant
