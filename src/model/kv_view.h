// How the forward pass finds a sequence's cached K/V: fixed-size pages in an
// arena it does not own, described by plain offsets (KvFormat) and a list of
// page addresses (KvSpan). The model writes each new token's K/V rows into
// its slot, in the page dtype, and reads earlier rows back for attention. It
// knows nothing of page allocation, generations or prefix sharing (kvcache/
// and the engine do); the engine translates its page pool into these views.
//
// SeqKv is the self-contained form for tools and tests: one sequence, BF16,
// its own arena.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/kernels.h"

namespace kvant {

struct ModelConfig;

// Byte layout of one page, as kvcache/kv_layout.h computes it: layer l's K
// block starts at l * layer_bytes + k_offset and holds [page_tokens, kv_heads,
// head_dim] elements; dynamic FP8 scales are [page_tokens, kv_heads] BF16 at
// k_scale_offset / v_scale_offset. With shared_kv (MLA) V is the K block.
struct KvFormat {
  kernels::KvElem elem = kernels::KvElem::kBf16;
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

  int64_t elem_bytes() const { return elem == kernels::KvElem::kBf16 ? 2 : 1; }
  int64_t row_bytes() const { return kv_heads * head_dim * elem_bytes(); }
};

// One sequence's pages: pages[i] holds tokens [i * page_tokens, (i + 1) *
// page_tokens). Must cover every position a forward step touches.
struct KvSpan {
  const KvFormat* format = nullptr;
  uint8_t* const* pages = nullptr;
  int64_t n_pages = 0;
  int64_t capacity() const { return format ? n_pages * format->page_tokens : 0; }
};

struct SeqKvOptions {
  kernels::KvElem elem = kernels::KvElem::kBf16;
  bool dynamic_scales = false;            // FP8: per-(token, head) scales in the page
  std::vector<float> static_k, static_v;  // FP8 static: [layers * kv_heads]
  int64_t page_tokens = 16;
};

// A single sequence's cache with its own arena (tools, tests, evaluation):
// BF16 by default, or FP8 with static or dynamic scales, in the same page
// layout the engine's pool uses.
class SeqKv : public KvSpan {
 public:
  SeqKv(const ModelConfig& c, int64_t capacity, const SeqKvOptions& o = {});
  SeqKv(const SeqKv&) = delete;
  SeqKv& operator=(const SeqKv&) = delete;

 private:
  KvFormat fmt_;
  AlignedBuffer<uint8_t> arena_;
  std::vector<uint8_t*> page_ptrs_;
};

// The FP32 -> page-dtype rule for one head's row, shared with
// kvcache/kv_codec (tests check both give the same bytes): BF16 rounds to
// nearest even; FP8 stores fp8(x / scale).
void kv_store_row(kernels::KvElem elem, const float* x, int64_t n, float scale, void* out);
// Dynamic per-(token, head) scale: amax over finite entries / the format's
// largest finite value, rounded up to a BF16 value (pages store it in 2
// bytes); 1 for an all-zero row; never below FLT_MIN.
float kv_row_scale(kernels::KvElem elem, const float* x, int64_t n);

}  // namespace kvant
