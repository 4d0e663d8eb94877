// SeqKv and the FP32 -> page-dtype row rule (see kv_view.h).
#include "model/kv_view.h"

#include <cmath>
#include <cstring>

#include "model/config.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant {

namespace {
int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
}  // namespace

SeqKv::SeqKv(const ModelConfig& c, int64_t capacity, const SeqKvOptions& o) {
  fmt_.elem = o.elem;
  fmt_.kv_heads = c.cache_heads();
  fmt_.head_dim = c.cache_dim();
  fmt_.page_tokens = o.page_tokens;
  // MLA: one row per token serves as K and V (shared block and scales).
  const bool shared = c.mla();
  const int64_t block = round_up(fmt_.page_tokens * fmt_.row_bytes(), 64);
  fmt_.k_offset = 0;
  fmt_.v_offset = shared ? 0 : block;
  fmt_.layer_bytes = shared ? block : 2 * block;
  if (o.elem != kernels::KvElem::kBf16) {
    fmt_.dynamic_scales = o.dynamic_scales;
    if (o.dynamic_scales) {
      const int64_t sblock = round_up(fmt_.page_tokens * fmt_.kv_heads * 2, 64);
      fmt_.k_scale_offset = fmt_.layer_bytes;
      fmt_.v_scale_offset = shared ? fmt_.layer_bytes : fmt_.layer_bytes + sblock;
      fmt_.layer_bytes += shared ? sblock : 2 * sblock;
    } else {
      fmt_.static_k = o.static_k;
      fmt_.static_v = o.static_v;
    }
  }
  if (c.index_topk > 0) {
    fmt_.index_dim = c.index_head_dim;
    fmt_.index_offset = fmt_.layer_bytes;
    fmt_.layer_bytes += round_up(fmt_.page_tokens * c.index_head_dim * 2, 64);
  }
  const int64_t n_pages = (capacity + fmt_.page_tokens - 1) / fmt_.page_tokens;
  const int64_t page_bytes = c.layers * fmt_.layer_bytes;
  arena_ = AlignedBuffer<uint8_t>(size_t(n_pages * page_bytes));
  for (int64_t p = 0; p < n_pages; ++p) page_ptrs_.push_back(arena_.data() + p * page_bytes);
  format = &fmt_;
  pages = page_ptrs_.data();
  this->n_pages = n_pages;
}

void kv_store_row(kernels::KvElem elem, const float* x, int64_t n, float scale, void* out) {
  switch (elem) {
    case kernels::KvElem::kBf16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(x[i]);
      return;
    }
    case kernels::KvElem::kFp8E4m3: {
      auto* o = static_cast<uint8_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_fp8_e4m3(x[i] / scale);
      return;
    }
    case kernels::KvElem::kFp8E5m2: {
      auto* o = static_cast<uint8_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = f32_to_fp8_e5m2(x[i] / scale);
      return;
    }
  }
}

float kv_row_scale(kernels::KvElem elem, const float* x, int64_t n) {
  const float max_finite = elem == kernels::KvElem::kFp8E4m3   ? kFp8E4m3Max
                           : elem == kernels::KvElem::kFp8E5m2 ? kFp8E5m2Max
                                                               : 0.0f;
  return fp8_row_scale(max_finite, x, n);
}

}  // namespace kvant
