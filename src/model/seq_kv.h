// SeqKv: one sequence's KV cache with its own arena, for tools, tests and
// evaluation, in exactly the page layout the engine's pool uses (kvcache/
// kv_layout.h makes both). BF16 by default, or FP8 with static or dynamic
// scales. The model's geometry (KV heads, or one latent row for MLA, and
// the sparse indexer's keys) comes from its config.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/aligned.h"
#include "kvcache/kv_layout.h"
#include "kvcache/kv_view.h"

namespace kvant {

struct ModelConfig;

// The KV geometry of a model's cache rows.
KvGeometry kv_geometry_for(const ModelConfig& c, KvDType dtype, KvScaleMode mode,
                           int64_t page_tokens);

struct SeqKvOptions {
  KvDType elem = KvDType::kBf16;
  bool dynamic_scales = false;            // FP8: per-(token, head) scales in the page
  std::vector<float> static_k, static_v;  // FP8 static: [layers * kv_heads]
  int64_t page_tokens = 16;
  // Where the pages live: null, host memory; else as PagePoolOptions::arena
  // (a GPU backend's memory: ModelRunner::kv_arena()).
  std::function<std::shared_ptr<uint8_t>(size_t bytes)> arena = nullptr;
};

class SeqKv : public KvSpan {
 public:
  SeqKv(const ModelConfig& c, int64_t capacity, const SeqKvOptions& o = {});
  SeqKv(const SeqKv&) = delete;
  SeqKv& operator=(const SeqKv&) = delete;

 private:
  KvFormat fmt_;
  AlignedBuffer<uint8_t> arena_;
  std::shared_ptr<uint8_t> ext_arena_;
  std::vector<uint8_t*> page_ptrs_;
};

}  // namespace kvant
