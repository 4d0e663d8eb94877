// Model: a loaded decoder and its forward pass over a batch of sequence
// chunks. Tokens of every sequence in the batch go through each matrix
// product together; attention runs per sequence against that sequence's KV.
// Each chunk's new K/V rows are written into its pages (kv_view.h) in the
// page dtype. Attention: a single-token chunk reads its pages directly
// (paged_attn_decode, FP8 decoded in registers); a longer chunk (prefill)
// runs in BF16 over its earlier pages gathered and its own fresh rows. The
// model does not schedule, sample, allocate pages or own sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/result.h"
#include "model/config.h"
#include "model/kv_view.h"
#include "model/weights.h"

namespace kvant {

struct SeqChunk {
  const KvSpan* kv = nullptr;  // the sequence's pages (covering pos0 + n_tokens)
  int64_t pos0 = 0;            // position of the chunk's first token
  int64_t n_tokens = 0;
  bool all_logits = false;  // logits for every token, else for the last only
};

struct Batch {
  std::vector<int32_t> tokens;  // all chunks' tokens, concatenated in seqs order
  std::vector<SeqChunk> seqs;
  int64_t logit_rows() const;
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path);
  Model(ModelConfig cfg, ModelWeights w);
  ~Model();
  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }

  // Runs the batch and writes logits [batch.logit_rows(), vocab] into `logits`,
  // in seqs order. Returns an error for out-of-range tokens or positions.
  Result<void> forward(const Batch& batch, std::span<float> logits);

 private:
  struct Workspace;
  void ensure_workspace(int64_t tokens, int64_t max_ctx, int64_t max_pages, int64_t gather_rows);
  void store_kv(int64_t layer, const Batch& b, int64_t T);
  void gather_kv(int64_t layer, const Batch& b);
  void layer_forward(int64_t layer, const Batch& b, int64_t T);
  void attention(int64_t layer, const Batch& b, int64_t T);
  void rope_tables(const Batch& b, int64_t T);

  ModelConfig cfg_;
  ModelWeights w_;
  std::vector<float> inv_freq_, inv_freq_local_;  // [head_dim/2]
  std::unique_ptr<Workspace> ws_;
  struct GatherPiece {
    int64_t seq, j0, j1;
  };
  std::vector<GatherPiece> gather_pieces_;
  std::vector<int64_t> chunk_t0_;  // [seqs] first batch token of each chunk
};

}  // namespace kvant
