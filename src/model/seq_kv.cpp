// SeqKv (see seq_kv.h).
#include "model/seq_kv.h"

#include "core/check.h"
#include "model/config.h"

namespace kvant {

KvGeometry kv_geometry_for(const ModelConfig& c, KvDType dtype, KvScaleMode mode,
                           int64_t page_tokens) {
  KvGeometry g;
  g.layers = c.kv_layers();
  g.kv_heads = c.cache_heads();
  g.head_dim = c.cache_dim();
  g.dtype = dtype;
  g.page_tokens = page_tokens;
  g.scale_mode = mode;
  g.shared_kv = c.mla();  // one row per token serves as K and V
  g.index_dim = c.index_topk > 0 ? c.index_head_dim : 0;
  return g;
}

SeqKv::SeqKv(const ModelConfig& c, int64_t capacity, const SeqKvOptions& o) {
  const KvScaleMode mode = o.elem == KvDType::kBf16 ? KvScaleMode::kNone
                           : o.dynamic_scales      ? KvScaleMode::kDynamic
                                                   : KvScaleMode::kStatic;
  auto layout = make_kv_layout(kv_geometry_for(c, o.elem, mode, o.page_tokens));
  KV_CHECK(layout.ok());
  fmt_ = kv_format(*layout, o.static_k, o.static_v);
  const int64_t n_pages = (capacity + fmt_.page_tokens - 1) / fmt_.page_tokens;
  const size_t bytes = size_t(n_pages * layout->page_bytes);
  uint8_t* base;
  if (o.arena) {
    ext_arena_ = o.arena(bytes);
    base = ext_arena_.get();
  } else {
    arena_ = AlignedBuffer<uint8_t>(bytes);
    base = arena_.data();
  }
  for (int64_t p = 0; p < n_pages; ++p) page_ptrs_.push_back(base + p * layout->page_bytes);
  format = &fmt_;
  pages = page_ptrs_.data();
  this->n_pages = n_pages;
}

}  // namespace kvant
