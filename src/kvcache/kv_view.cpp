// KvFormat from a KvLayout (see kv_view.h).
#include "kvcache/kv_view.h"

#include <utility>

namespace kvant {

KvFormat kv_format(const KvLayout& L, std::vector<float> static_k, std::vector<float> static_v) {
  const KvGeometry& g = L.geometry;
  KvFormat f;
  f.elem = g.dtype;
  f.kv_heads = g.kv_heads;
  f.head_dim = g.head_dim;
  f.page_tokens = g.page_tokens;
  f.layer_bytes = L.layer_bytes;
  f.k_offset = L.k_offset;
  f.v_offset = L.v_offset;
  f.dynamic_scales = g.scale_mode == KvScaleMode::kDynamic;
  f.k_scale_offset = L.k_scale_offset;
  f.v_scale_offset = L.v_scale_offset;
  f.index_dim = g.index_dim;
  f.index_offset = L.index_offset;
  if (g.scale_mode == KvScaleMode::kStatic) {
    f.static_k = std::move(static_k);
    f.static_v = std::move(static_v);
  }
  return f;
}

}  // namespace kvant
