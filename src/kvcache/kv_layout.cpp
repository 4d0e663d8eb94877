// Page layout arithmetic (see kv_layout.h). The only place offsets are
// computed; the pool and any kernel take them from KvLayout.
#include "kvcache/kv_layout.h"

#include <string>

#include "numerics/fp8.h"

namespace kvant {
namespace {

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Keeps every product below 2^62 so no layout computation can overflow.
constexpr int64_t kMaxDim = int64_t(1) << 20;
constexpr int64_t kMaxPageBytes = int64_t(1) << 34;

}  // namespace

const char* kv_dtype_name(KvDType d) {
  switch (d) {
    case KvDType::kBf16:
      return "bf16";
    case KvDType::kFp8E4m3:
      return "fp8_e4m3";
    case KvDType::kFp8E5m2:
      return "fp8_e5m2";
  }
  return "?";
}

const char* kv_scale_mode_name(KvScaleMode m) {
  switch (m) {
    case KvScaleMode::kNone:
      return "none";
    case KvScaleMode::kStatic:
      return "static";
    case KvScaleMode::kDynamic:
      return "dynamic";
  }
  return "?";
}

int64_t kv_dtype_bytes(KvDType d) { return d == KvDType::kBf16 ? 2 : 1; }

float kv_dtype_max_finite(KvDType d) {
  switch (d) {
    case KvDType::kBf16:
      return 0.0f;
    case KvDType::kFp8E4m3:
      return kFp8E4m3Max;
    case KvDType::kFp8E5m2:
      return kFp8E5m2Max;
  }
  return 0.0f;
}

Result<KvLayout> make_kv_layout(const KvGeometry& g) {
  auto dim_ok = [](int64_t v) { return v > 0 && v <= kMaxDim; };
  if (!dim_ok(g.layers) || !dim_ok(g.kv_heads) || !dim_ok(g.head_dim) || !dim_ok(g.page_tokens))
    return make_error(
        "kv geometry: layers, kv_heads, head_dim and page_tokens must be in [1, 2^20]"
        " (got " +
        std::to_string(g.layers) + ", " + std::to_string(g.kv_heads) + ", " +
        std::to_string(g.head_dim) + ", " + std::to_string(g.page_tokens) + ")");
  if (g.dtype != KvDType::kBf16 && g.dtype != KvDType::kFp8E4m3 && g.dtype != KvDType::kFp8E5m2)
    return make_error("kv geometry: unknown dtype " + std::to_string(int(g.dtype)));
  const bool fp8 = g.dtype != KvDType::kBf16;
  if (!fp8 && g.scale_mode != KvScaleMode::kNone)
    return make_error(std::string("kv geometry: bf16 pages take scale mode none, got ") +
                      kv_scale_mode_name(g.scale_mode));
  if (fp8 && g.scale_mode != KvScaleMode::kStatic && g.scale_mode != KvScaleMode::kDynamic)
    return make_error(std::string("kv geometry: ") + kv_dtype_name(g.dtype) +
                      " pages need scale mode static or dynamic");

  KvLayout l;
  l.geometry = g;
  l.elem_bytes = kv_dtype_bytes(g.dtype);
  l.row_elems = g.kv_heads * g.head_dim;
  if (l.row_elems > kMaxDim) return make_error("kv geometry: kv_heads * head_dim exceeds 2^20");
  l.data_block_bytes = round_up(g.page_tokens * l.row_elems * l.elem_bytes, kKvBlockAlign);
  const bool dynamic = g.scale_mode == KvScaleMode::kDynamic;
  l.scale_block_bytes =
      dynamic ? round_up(g.page_tokens * g.kv_heads * kKvScaleBytes, kKvBlockAlign) : 0;
  const int64_t streams = g.shared_kv ? 1 : 2;  // K only, or K and V
  // Order inside a layer: K data, V data, K scales, V scales. Data first so
  // the common (static/BF16) case has no holes, and a kernel that streams K
  // then V reads contiguous memory.
  l.k_offset = 0;
  l.v_offset = g.shared_kv ? 0 : l.data_block_bytes;
  l.k_scale_offset = streams * l.data_block_bytes;
  l.v_scale_offset = g.shared_kv ? l.k_scale_offset : l.k_scale_offset + l.scale_block_bytes;
  l.layer_bytes = streams * (l.data_block_bytes + l.scale_block_bytes);
  if (g.index_dim < 0 || g.index_dim > kMaxDim)
    return make_error("kv geometry: index_dim must be in [0, 2^20]");
  l.index_block_bytes = g.index_dim > 0 ? round_up(g.page_tokens * g.index_dim * 2, kKvBlockAlign) : 0;
  l.index_offset = l.layer_bytes;
  l.layer_bytes += l.index_block_bytes;
  l.page_bytes = g.layers * l.layer_bytes;
  if (l.page_bytes > kMaxPageBytes)
    return make_error("kv geometry: one page would take " + std::to_string(l.page_bytes) +
                      " bytes (limit 2^34); use fewer page_tokens");
  const int64_t scale_bytes_per_token = dynamic ? g.kv_heads * kKvScaleBytes : 0;
  l.payload_bytes_per_token =
      g.layers * (streams * (l.row_elems * l.elem_bytes + scale_bytes_per_token) + 2 * g.index_dim);
  return l;
}

int64_t kv_pages_for_budget(const KvLayout& layout, int64_t bytes) {
  if (bytes <= 0 || layout.page_bytes <= 0) return 0;
  return bytes / layout.page_bytes;
}

}  // namespace kvant
