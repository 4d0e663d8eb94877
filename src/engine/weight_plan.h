// Weight bytes of a Hugging Face config, for `kvant plan`: every tensor the
// config implies (embeddings, attention -- GQA or MLA with GLM-5's indexer --
// dense and routed MLPs, shared experts, routers, norms, multi-token-
// prediction layers), sized under a precision policy: the checkpoint's own
// (its quantization_config: FP8 blocks, compressed-tensors INT4 with its
// ignore list, or plain BF16), all linears FP8, or routed experts INT4. It
// loads no weights; the engine's own memory use is not modelled here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/result.h"

namespace kvant {

// One kind of weight: `count` tensors of [rows, cols] (cols = 1 for
// vectors). `module` is a representative module name, matched against a
// checkpoint's ignore / not-convert lists.
struct WeightGroup {
  std::string name;
  std::string module;
  int64_t rows = 0, cols = 0, count = 0;
  bool linear = false;  // a quantizable projection (not embeddings, norms, routers)
  bool expert = false;  // a routed expert's projection
  bool mtp = false;     // belongs to a multi-token-prediction layer
  int64_t params() const { return rows * cols * count; }
};

enum class WeightFormat { kBf16, kFp8Block, kInt4 };

// How one precision policy stores each group.
struct WeightPolicy {
  std::string name;         // "native", "bf16", "fp8", "int4-experts", ...
  std::string description;  // how it treats each kind of tensor
  std::vector<WeightFormat> formats;  // per group
  int int4_group = 32;
  int64_t fp8_block = 128;
};

struct WeightPolicyBytes {
  std::string name, description;
  double bytes = 0;          // the whole checkpoint (MTP layers included)
  double bytes_no_mtp = 0;   // without multi-token-prediction layers
  double expert_bytes = 0;   // routed experts alone
};

struct WeightPlan {
  std::string architecture;
  std::vector<WeightGroup> groups;
  int64_t params = 0, params_no_mtp = 0, expert_params = 0, active_params = 0;
  std::vector<WeightPolicyBytes> policies;  // native first
  std::vector<std::string> notes;
};

// Bytes of one [rows, cols] tensor stored in a format (FP8: e4m3 values and
// an FP32 scale per block x block tile; INT4: packed nibbles and a BF16 scale
// per group of a row).
double weight_tensor_bytes(WeightFormat f, int64_t rows, int64_t cols, int int4_group = 32,
                           int64_t fp8_block = 128);

Result<WeightPlan> weight_plan_from_config(const nlohmann::json& config);

nlohmann::json weight_plan_to_json(const WeightPlan& plan);

}  // namespace kvant
