// How a forward step finds a sequence's cached K/V: the page layout as plain
// offsets (KvFormat, made from kv_layout.h's KvLayout and nothing else) and
// one sequence's pages (KvSpan). The backends write each new token's rows
// into its slot and read earlier rows back through these; they know nothing
// of allocation, generations or prefix sharing (page_pool.h and the engine
// do). The row encoding is kv_codec.h's.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/kv_layout.h"

namespace kvant {

// Byte layout of one page: layer l's K block starts at l * layer_bytes +
// k_offset and holds [page_tokens, kv_heads, head_dim] elements; dynamic FP8
// scales are [page_tokens, kv_heads] BF16 at k_scale_offset / v_scale_offset.
// With shared K/V (MLA) the V block is the K block.
struct KvFormat {
  KvDType elem = KvDType::kBf16;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_tokens = 16;
  int64_t layer_bytes = 0;
  int64_t k_offset = 0;
  int64_t v_offset = 0;
  bool dynamic_scales = false;  // FP8 per-(token, head) scales in the page
  int64_t k_scale_offset = 0;
  int64_t v_scale_offset = 0;
  // DSA indexer keys: [page_tokens, index_dim] BF16 at index_offset (0: none).
  int64_t index_dim = 0;
  int64_t index_offset = 0;
  // Static FP8 scales, [layers * kv_heads] (empty for BF16 and dynamic).
  std::vector<float> static_k, static_v;

  int64_t elem_bytes() const { return elem == KvDType::kBf16 ? 2 : 1; }
  int64_t row_bytes() const { return kv_heads * head_dim * elem_bytes(); }
  bool shared_kv() const { return v_offset == k_offset; }
};

// The format of a layout; static scales ([layers * kv_heads] each) are
// taken when the layout's scale mode is static.
KvFormat kv_format(const KvLayout& layout, std::vector<float> static_k = {},
                   std::vector<float> static_v = {});

// One sequence's pages: pages[i] holds tokens [i * page_tokens, (i + 1) *
// page_tokens). Must cover every position a forward step touches.
struct KvSpan {
  const KvFormat* format = nullptr;
  uint8_t* const* pages = nullptr;
  int64_t n_pages = 0;
  int64_t capacity() const { return format ? n_pages * format->page_tokens : 0; }
};

}  // namespace kvant
