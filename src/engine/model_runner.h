// ModelRunner: kvant's public API for tools (benchmarks, evaluation,
// calibration): a loaded model driven directly, one forward at a time, over
// sequence caches the caller owns (SeqKv, model/seq_kv.h). No scheduler,
// page pool, tokenizer or sampling: serving goes through Engine (engine.h).
//
// Weights load as the engine loads them: a precision per phase, prefill
// chunks (more than one token) on one set and decode chunks (one token) on
// the other, both resident when they differ. A forward is exactly the
// model's: each chunk's new K/V rows go into its cache, and logits rows come
// back in chunk order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "core/result.h"
#include "model/config.h"
#include "model/seq_kv.h"

namespace kvant {
namespace dist {
class Communicator;
}

struct RunnerOptions {
  std::string model_path;  // GGUF file or Hugging Face directory
  // As EngineOptions: "native" (the checkpoint's own), "bf16" or "int4" per
  // phase; INT4 from a BF16/GGUF checkpoint is quantized at load (RTN,
  // int4_group, symmetric).
  std::string prefill_weights = "native", decode_weights = "native";
  int int4_group = 128;
  bool int4_lm_head = false;
  std::string backend = "cpu";
  // Tensor / expert parallelism (model/model.h, Parallelism): every rank
  // loads its slice and must call forward with the same chunks, in step.
  std::shared_ptr<dist::Communicator> comm;
  int tp = 1, ep = 1;
};

// One sequence's chunk in a forward: `tokens` at positions pos0.. of the
// sequence whose pages `kv` holds (covering pos0 + tokens.size()).
struct RunChunk {
  const KvSpan* kv = nullptr;
  int64_t pos0 = 0;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every token, else for the last only
  // With all_logits: the first logit_skip tokens get none (the rows start at
  // token logit_skip of the chunk).
  int64_t logit_skip = 0;
  int64_t logit_count() const { return all_logits ? int64_t(tokens.size()) - logit_skip : 1; }
};
// Logits rows a forward over `chunks` writes.
int64_t logit_rows(std::span<const RunChunk> chunks);

class ModelRunner {
 public:
  // Errors: a bad precision or group, and whatever the load reports.
  static Result<std::unique_ptr<ModelRunner>> load(const RunnerOptions& options);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // The sizes this process computes with (its share under TP / EP), and the
  // whole model's.
  const ModelConfig& config() const;
  const ModelConfig& full_config() const;
  // The KV (cache) heads of every layer whose rows this process's caches
  // hold: [first, last) of full_config().cache_heads(); all in one process.
  std::pair<int64_t, int64_t> kv_heads_held() const;
  // Rank and ranks of the communicator (0 and 1 in one process).
  int rank() const;
  int ranks() const;
  // Weight sets (one, or two when prefill and decode differ) and which
  // phase uses which.
  int prefill_set() const;
  int decode_set() const;
  // "bf16" or "int4" (or "mixed" when only some products are INT4).
  std::string set_precision(int set) const;
  // Bytes of a set's weights as held in memory (every product and the embedding).
  size_t set_bytes(int set) const;
  // The backend's name and device ("cpu", "avx512bf16"; "cuda", the GPU).
  std::string backend_name() const;
  std::string device() const;
  // Memory for KV pages where the backend computes (SeqKvOptions::arena):
  // null for a host-memory backend.
  std::function<std::shared_ptr<uint8_t>(size_t bytes)> kv_arena() const;

  // Plans the workspace for forwards of up to `tokens` rows attending over
  // up to `context` positions, so that they allocate nothing; a larger one
  // still runs (the workspace then grows).
  void reserve(int64_t tokens, int64_t context);

  // Runs the chunks as one batch and writes logits [logit_rows(chunks),
  // vocab] into `logits`, in chunk order. Returns an error for out-of-range
  // tokens or positions, or a buffer too small.
  Result<void> forward(std::span<const RunChunk> chunks, std::span<float> logits);
  // Seconds of forward spent in collectives (0 in one process).
  double comm_seconds() const;
  // Diagnostic: a timed barrier before every collective; comm_wait_seconds
  // is the part of comm_seconds spent waiting there for the last rank
  // (model/model.h, set_comm_split).
  void set_comm_split(bool on);
  double comm_wait_seconds() const;
  Result<void> forward(const RunChunk& chunk, std::span<float> logits) {
    return forward(std::span<const RunChunk>(&chunk, 1), logits);
  }

 private:
  ModelRunner();
  struct Impl;  // the model and the batch a forward reuses
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvant
