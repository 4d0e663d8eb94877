// Loads a model (config + weights) from a GGUF file or a Hugging Face
// directory through io/'s TensorSource, mapping each file's tensor names to
// kvant's parameters. Knows file naming conventions, not file formats.
#pragma once

#include <string>

#include "core/result.h"
#include "dist/shard_plan.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvant {
class ModelFiles;
namespace backend {
class Backend;
}

// Which form the linear layers of a weight set take. kNative: the
// checkpoint's own (INT4 where it holds compressed-tensors W4A16 weights,
// FP8 where it holds block-scaled FP8 ones, else BF16).
enum class WeightPrecision : uint8_t { kNative, kBf16, kInt4, kFp8 };
const char* weight_precision_name(WeightPrecision p);

struct WeightSetOptions {
  WeightPrecision precision = WeightPrecision::kNative;
  // Converting a BF16/FP8/GGUF checkpoint to INT4 at load: RTN, symmetric,
  // this group size; layers whose input size it does not divide stay BF16.
  // FP8 from a checkpoint that is not block-scaled FP8: 128x128 block amax
  // scales (numerics/fp8_block.h).
  int int4_group = 128;
  bool int4_lm_head = false;  // also quantize the output projection
  // INT4 sets from an INT4 checkpoint: products stored without any INT4
  // part (the checkpoint's quantization_config ignore list) stay BF16
  // instead of being quantized at load. Implied by precision kNative.
  bool keep_stored_bf16 = false;
  // Prepares the products (the CPU backend when null).
  const backend::Backend* backend = nullptr;
  // Tensor/expert parallelism: this process's rank in each; it loads the
  // slice dist::make_shard_plan gives it (INT4-safe blocks of shard_align).
  // The weights are then shaped by dist::local_config, while
  // LoadedModel::config stays the checkpoint's own.
  int tp = 1, tp_rank = 0, ep = 1, ep_rank = 0;
  int64_t shard_align = 128;
  // When the model's sizes do not split in shard_align blocks, split in
  // these instead (0: fail). FP8 checkpoints prefer whole 128-wide scale
  // blocks (the codes are then kept as stored) but run in smaller ones.
  int64_t shard_align_fallback = 0;
  // Load the checkpoint's first multi-token-prediction layer (Hugging Face
  // DeepSeek-V3 / GLM-4.5 checkpoints with num_nextn_predict_layers; its
  // decoder layer split like the others under TP / EP). The config then
  // says mtp_layers 1; otherwise 0.
  bool mtp = false;
};

struct LoadedModel {
  ModelConfig config;
  ModelWeights weights;
  dist::ShardPlan shard;  // what the weights hold of the checkpoint
};

Result<LoadedModel> load_model(const std::string& path, const WeightSetOptions& opts = {});
// From files already open (one ModelFiles serves every weight set and the tokenizer).
Result<LoadedModel> load_model(const ModelFiles& files, const WeightSetOptions& opts = {});

// True when the checkpoint at `path` holds INT4 (compressed-tensors) linears.
bool checkpoint_is_int4(const std::string& path);

}  // namespace kvant
