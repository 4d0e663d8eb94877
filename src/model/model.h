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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/result.h"
#include "model/config.h"
#include "model/kv_view.h"
#include "model/loader.h"
#include "model/ops.h"
#include "model/weights.h"

namespace kvant {

struct SeqChunk {
  const KvSpan* kv = nullptr;  // the sequence's pages (covering pos0 + n_tokens)
  int64_t pos0 = 0;            // position of the chunk's first token
  int64_t n_tokens = 0;
  bool all_logits = false;  // logits for every token, else for the last only
  // With all_logits: the first logit_skip tokens get none (the rows start at
  // token logit_skip of the chunk).
  int64_t logit_skip = 0;
  int64_t logit_count() const { return all_logits ? n_tokens - logit_skip : 1; }
};

struct Batch {
  std::vector<int32_t> tokens;  // all chunks' tokens, concatenated in seqs order
  std::vector<SeqChunk> seqs;
  int64_t logit_rows() const;
};

// Weight precision per phase: prefill chunks (more than one token) use one
// set, decode chunks (one token) the other; both stay resident when they
// differ, the single-machine form of disaggregated serving. The KV layout is
// the same either way. kNative takes the checkpoint's own form.
struct WeightOptions {
  WeightPrecision prefill = WeightPrecision::kNative;
  WeightPrecision decode = WeightPrecision::kNative;
  int int4_group = 128;       // quantizing a BF16/GGUF checkpoint at load (RTN)
  bool int4_lm_head = false;  // ... including the output projection
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path,
                                             const WeightOptions& opts = {});
  Model(ModelConfig cfg, ModelWeights w);
  // sets: one or two weight sets; prefill/decode index them.
  Model(ModelConfig cfg, std::vector<ModelWeights> sets, int prefill_set, int decode_set);
  ~Model();
  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return sets_[0]; }
  const ModelWeights& weight_set(int i) const { return sets_[size_t(i)]; }
  int prefill_set() const { return prefill_set_; }
  int decode_set() const { return decode_set_; }
  // "bf16" or "int4" (or "mixed" when only some products are INT4).
  std::string set_precision(int i) const;
  // Bytes of a set's weights as held in memory.
  size_t set_bytes(int i) const;

  // Calibration hook (weight quantizers): called with the FP32 input rows
  // of every product before it runs. which: 0 q|k|v, 1 o, 2 gate|up, 3 down.
  using LinearObserver =
      std::function<void(int64_t layer, int which, const float* x, int64_t ldx, int64_t rows)>;
  void set_observer(LinearObserver f) { observer_ = std::move(f); }

  // Runs the batch and writes logits [batch.logit_rows(), vocab] into `logits`,
  // in seqs order. Returns an error for out-of-range tokens or positions.
  Result<void> forward(const Batch& batch, std::span<float> logits);

 private:
  struct Workspace;
  void ensure_workspace(int64_t tokens, int64_t max_ctx, int64_t max_pages, int64_t gather_rows);
  void store_kv(int64_t layer, const Batch& b, int64_t T);
  void gather_kv(int64_t layer, const Batch& b);
  void layer_forward(int64_t layer, const Batch& b, int64_t T);
  void moe_forward(int64_t layer);
  void attention(int64_t layer, const Batch& b, int64_t T);
  void mla_attention(int64_t layer, const Batch& b, int64_t T);
  void mla_index(int64_t layer, const Batch& b, int64_t T, int64_t ldx);
  void rope_tables(const Batch& b, int64_t T);

  // Rows [t0, t1) of the batch that use weight set `set`.
  struct RowSegment {
    int64_t t0, t1;
    int set;
  };
  void linear(int64_t layer, int which, const float* x, int64_t ldx, float* y, int64_t ldy);

  ModelConfig cfg_;
  std::vector<ModelWeights> sets_;
  int prefill_set_ = 0, decode_set_ = 0;
  std::vector<RowSegment> segs_, logit_segs_;
  LinearObserver observer_;
  std::vector<float> inv_freq_, inv_freq_local_;  // [head_dim/2]
  std::unique_ptr<Workspace> ws_;
  struct GatherPiece {
    int64_t seq, j0, j1;
  };
  std::vector<GatherPiece> gather_pieces_;
  std::vector<int64_t> chunk_t0_;  // [seqs] first batch token of each chunk
};

}  // namespace kvant
