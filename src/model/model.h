// Model: a loaded decoder and its forward pass over a batch of sequence
// chunks. Tokens of every sequence in the batch go through each matrix
// product together; attention runs per sequence against that sequence's KV.
// The KV here is a contiguous per-sequence BF16 store (SeqKv); the model does
// not schedule, sample or own sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/result.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvant {

// K and V rows of one sequence, per layer: [capacity, kv_heads, head_dim]
// each, BF16 (K after RoPE).
class SeqKv {
 public:
  SeqKv(const ModelConfig& c, int64_t capacity);
  int64_t capacity() const { return capacity_; }
  int64_t row_stride() const { return kv_dim_; }
  uint16_t* k(int64_t layer, int64_t pos) { return k_[size_t(layer)].data() + pos * kv_dim_; }
  uint16_t* v(int64_t layer, int64_t pos) { return v_[size_t(layer)].data() + pos * kv_dim_; }

 private:
  int64_t capacity_;
  int64_t kv_dim_;
  std::vector<AlignedBuffer<uint16_t>> k_, v_;
};

struct SeqChunk {
  SeqKv* kv = nullptr;
  int64_t pos0 = 0;        // position of the chunk's first token
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
  void ensure_workspace(int64_t tokens, int64_t max_ctx);
  void layer_forward(int64_t layer, const Batch& b, int64_t T);
  void attention(int64_t layer, const Batch& b, int64_t T);
  void rope_tables(const Batch& b, int64_t T);

  ModelConfig cfg_;
  ModelWeights w_;
  std::vector<float> inv_freq_, inv_freq_local_;  // [head_dim/2]
  std::unique_ptr<Workspace> ws_;
};

}  // namespace kvant
