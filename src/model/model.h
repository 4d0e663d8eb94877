// Model: a loaded decoder and its forward pass over a batch of sequence
// chunks, written once over the backend layer (backend/backend.h): the
// model says what is computed and in which order; its backend computes it.
// Tokens of every sequence in the batch go through each matrix product
// together; attention runs per sequence against that sequence's KV. Each
// chunk's new K/V rows are written into its pages (kvcache/kv_view.h) in the
// page dtype. Attention: a single-token chunk reads its pages directly (FP8
// decoded inside the kernel); a longer chunk (prefill) runs in BF16 over its
// earlier pages gathered and its own fresh rows. The model does not
// schedule, sample, allocate pages or own sequences. The blocks live in
// model/blocks/ (attention, mla, moe, mlp, rope).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/result.h"
#include "dist/communicator.h"
#include "dist/shard_plan.h"
#include "model/config.h"
#include "backend/backend.h"
#include "model/loader.h"
#include "model/seq_kv.h"
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
  bool no_logits = false;  // no logits at all (the K/V rows only)
  int64_t logit_count() const { return no_logits ? 0 : all_logits ? n_tokens - logit_skip : 1; }
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
  std::string backend = "cpu";  // backend::available_backends()
  // Also load the checkpoint's multi-token-prediction layer (forward_mtp).
  bool mtp = false;
};

// Tensor and expert parallelism (dist/shard_plan.h): the processes of
// `comm` run one model together, each over its slice. tp and ep are each 1
// or comm->size(); with both above 1, EP runs over the TP ranks. The
// communicator outlives the model. Null comm: one process, the whole model.
//  - TP: column-parallel q|k|v and gate|up, row-parallel o and down (one
//    all-reduce each), vocabulary-parallel embedding (zero rows for ids of
//    other ranks, then an all-reduce) and output head (an all-gather of the
//    ranks' logit columns). Each rank's KV pages hold its own KV heads.
//  - EP: each rank computes its own experts for every token routed to them
//    (every rank holds every token's hidden state, so the dispatch moves
//    nothing); an all-to-all returns each expert output row to the rank
//    that owns the token, which sums a token's experts in ascending order,
//    as one process does; an all-gather then gives every rank every row.
struct Parallelism {
  dist::Communicator* comm = nullptr;
  int tp = 1, ep = 1;
};
// Errors: tp or ep neither 1 nor the process count, or neither of them the
// process count (Model::load checks before it reads a weight).
Result<void> check_parallelism(const Parallelism& par);

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path,
                                             const WeightOptions& opts = {});
  // From files already open (io/model_files.h): every weight set from them.
  static Result<std::unique_ptr<Model>> load(const ModelFiles& files,
                                             const WeightOptions& opts = {},
                                             const Parallelism& par = {});
  Model(ModelConfig cfg, ModelWeights w);
  // sets: one or two weight sets; prefill/decode index them. backend: the
  // one the weights were prepared by (the CPU backend when null).
  Model(ModelConfig cfg, std::vector<ModelWeights> sets, int prefill_set, int decode_set,
        std::unique_ptr<backend::Backend> be = nullptr);
  ~Model();
  // The sizes this process computes with: the checkpoint's own, or under
  // tensor parallelism its rank's share (dist::local_config: heads,
  // kv_heads, ffn ... of the rank; vocab whole, as logits are).
  const ModelConfig& config() const { return cfg_; }
  // The checkpoint's own sizes, and this rank's share of them.
  const ModelConfig& full_config() const { return full_cfg_; }
  const dist::ShardPlan& shard() const { return shard_; }
  // Splits the model over par's ranks (load does this, with the plan its
  // weights were loaded by; before the first forward).
  Result<void> set_parallelism(const Parallelism& par, const ModelConfig& full,
                               const dist::ShardPlan& plan);
  // The communicator and the split (null and 1, 1 in one process).
  dist::Communicator* communicator() const { return comm_; }
  int tp() const { return tp_; }
  int ep() const { return ep_; }
  // Seconds spent in collectives during forwards so far (waiting for the
  // slowest rank included): the communication share of a step is this over
  // the forward's time.
  double comm_seconds() const { return comm_seconds_; }
  // Diagnostic (bench --comm-split): every collective first waits in a
  // barrier, timed apart, so that the time in collectives splits into
  // waiting for the last rank to arrive (comm_wait_seconds) and the transfer
  // once all have (the rest of comm_seconds). The barrier adds one round
  // trip per collective, so steps run slower with it on.
  void set_comm_split(bool on) { comm_split_ = on; }
  double comm_wait_seconds() const { return comm_wait_seconds_; }
  const ModelWeights& weights() const { return sets_[0]; }
  const ModelWeights& weight_set(int i) const { return sets_[size_t(i)]; }
  int prefill_set() const { return prefill_set_; }
  int decode_set() const { return decode_set_; }
  // "bf16", "int4" or "fp8" (or "mixed" when only some products are), over
  // every linear product of the set (for_each_linear).
  std::string set_precision(int i) const;
  // Bytes of a set's weights as held in memory (every product and the embedding).
  size_t set_bytes(int i) const;
  const char* backend_name() const { return be_->name(); }
  backend::Backend& backend() const { return *be_; }

  // Plans the workspace (the model's activations and the backend's scratch)
  // for steps of up to `tokens` rows attending over up to `context`
  // positions, so that later steps of that size allocate nothing (the BF16
  // context rows a prefill gathers grow with the first long prompt). A
  // larger step still runs: the workspace then grows.
  void reserve(int64_t tokens, int64_t context);

  // Calibration hook (weight quantizers): called with the FP32 input rows
  // of every product before it runs. which: 0 q|k|v, 1 o, 2 gate|up, 3 down.
  using LinearObserver =
      std::function<void(int64_t layer, int which, const float* x, int64_t ldx, int64_t rows)>;
  void set_observer(LinearObserver f) { observer_ = std::move(f); }

  // Runs the batch and writes logits [batch.logit_rows(), vocab] into `logits`,
  // in seqs order. Returns an error for out-of-range tokens or positions.
  Result<void> forward(const Batch& batch, std::span<float> logits);

  // Multi-token prediction (config().mtp_layers > 0): the MTP layer over
  // rows of the last forward. Chunk k of `batch` covers positions
  // [pos0, pos0 + n_tokens) of a sequence whose main hidden states (the last
  // layer's output, before the final norm) are rows src_row0[k] ... of the
  // last forward, in order; its tokens are each position's next token. The
  // layer writes its K/V at those positions (its own pages, layer index
  // config().layers) and the logits it gives predict the token after that
  // next one: the draft. Call it before the next forward; the rows must
  // belong to the last forward.
  Result<void> forward_mtp(const Batch& batch, std::span<const int64_t> src_row0,
                           std::span<float> logits);

 private:
  struct Workspace;  // model/model_impl.h
  // Rows [t0, t1) of the batch that use weight set `set`.
  struct RowSegment {
    int64_t t0, t1;
    int set;
  };
  Result<void> plan_step(const Batch& b);
  void ensure_workspace(int64_t tokens, int64_t ctx, int64_t gather_rows);
  void layer_forward(int64_t layer);
  // Sums a partial result over the TP ranks (nothing on one rank). A
  // transport failure ends every rank: the peers wait in the same
  // collective and cannot go on.
  void reduce_tp(backend::F32 x);
  void comm_failed(const Error& e);
  // Runs one collective (a callable returning Result<void>): its time goes
  // to comm_seconds_, a failure to comm_failed.
  template <class F>
  void collective(F&& call);
  void moe_combine_ep(int64_t n, backend::F32 os);  // blocks/moe.cpp
  void gather_logits(int64_t rows, std::span<float> logits);
  void attention(int64_t layer);           // blocks/attention.cpp
  void mla_attention(int64_t layer);       // blocks/mla.cpp
  void mla_index(int64_t layer);           // blocks/dsa_indexer.cpp
  void moe_forward(int64_t layer);         // blocks/moe.cpp
  void mlp_forward(int64_t layer);         // blocks/mlp.cpp
  void rope_tables();                      // blocks/rope.cpp
  void logits_forward(const Batch& b, std::span<float> logits, bool mtp_head = false);
  const LayerWeights& layer(int set, int64_t l) const { return sets_[size_t(set)].layers[size_t(l)]; }
  // Product `which` (0 q|k|v, 1 o, 2 gate|up, 3 down) of layer l for every
  // row, each row segment through its weight set.
  void linear(int64_t layer, int which, backend::CF32 x, backend::F32 y);

  ModelConfig cfg_, full_cfg_;
  dist::ShardPlan shard_;
  dist::Communicator* comm_ = nullptr;
  int tp_ = 1, ep_ = 1;
  double comm_seconds_ = 0, comm_wait_seconds_ = 0;
  bool comm_split_ = false;
  std::vector<ModelWeights> sets_;
  int prefill_set_ = 0, decode_set_ = 0;
  std::unique_ptr<backend::Backend> be_;
  backend::StepPlan plan_;
  std::vector<RowSegment> segs_, logit_segs_;
  LinearObserver observer_;
  std::vector<float> inv_freq_, inv_freq_local_;  // [rope_dim/2]
  std::unique_ptr<Workspace> ws_;
};

}  // namespace kvant
