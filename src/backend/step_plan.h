// What one forward step computes attention over, built once per forward by
// the model and read by every layer's KV and attention operations: the
// step's chunks (a sequence's consecutive tokens, its pages and where its
// rows sit in the step's activations), each token's chunk and position, and
// the sizes the backend's scratch must cover. Plain data: no model, no
// kernels, no allocation once its vectors have grown to the largest step.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/kv_view.h"

namespace kvant::backend {

struct StepChunk {
  const KvSpan* kv = nullptr;  // the sequence's pages (covering pos0 + n_tokens)
  int64_t pos0 = 0;            // position of the chunk's first token
  int64_t n_tokens = 0;
  int64_t t0 = 0;  // the chunk's first row in the step's activations
  // Prefill chunks attend over BF16 rows gathered for them: positions
  // [gather_j0, pos0 + n_tokens) at rows gather_off onwards. -1: the chunk
  // decodes straight from its pages.
  int64_t gather_off = -1;
  int64_t gather_j0 = 0;
  bool decodes() const { return gather_off < 0; }
};

struct StepToken {
  int32_t chunk = 0;  // index into StepPlan::chunks
  int64_t pos = 0;    // position in its sequence
};

struct StepPlan {
  std::vector<StepChunk> chunks;
  std::vector<StepToken> tokens;         // [T], in activation row order
  std::vector<int64_t> decode_chunks;    // chunks that decode from pages, in order
  std::vector<int64_t> decode_rows;      // [decode_chunks]: each one's activation row (t0)
  int64_t max_ctx = 0;      // longest context a token attends over (+1 for itself)
  int64_t max_pages = 0;    // most pages of one chunk's span
  int64_t gather_rows = 0;  // BF16 context rows all prefill chunks gather
  bool any_prefill = false;
  int64_t n_tokens() const { return int64_t(tokens.size()); }
};

}  // namespace kvant::backend
