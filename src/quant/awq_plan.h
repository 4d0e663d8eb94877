// Activation-aware INT4 for a whole dense model: runs the BF16 model on
// calibration tokens, captures the inputs of each layer's q|k|v, gate|up and
// down products (model.h's observer), searches a column scale for each
// (awq.h), and turns them into per-tensor edits in Hugging Face names that
// leave the FP model unchanged: weight columns times s, and the preceding
// norm (input_layernorm, the pre-MLP norm) or the up_proj rows divided by s.
// The o_proj input comes from attention over v; with grouped KV heads its
// scale could not be folded per query head, so o_proj keeps plain RTN.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/model.h"
#include "quant/awq.h"

namespace kvant {

struct AwqPlan {
  std::map<std::string, std::vector<float>> col_mul;   // weight [rows, cols]: column c times s[c]
  std::map<std::string, std::vector<float>> row_div;   // weight [rows, cols]: row r divided by s[r]
  std::map<std::string, std::vector<float>> norm_div;  // norm [n]: divided by s (Gemma: 1 + w)
  bool norm_plus_one = false;                          // Gemma: the forward uses 1 + w
  // By weight name: the mean square of each input column over the captured
  // rows, divided by s^2 where the columns are scaled (the input the scaled
  // weight meets); weights a clip search's error (no o_proj: not captured).
  std::map<std::string, std::vector<float>> col_energy;
  std::vector<std::string> report;                     // one line per searched product
  // Applies the edits for one tensor (no-op for names the plan does not touch).
  void apply(const std::string& name, const std::vector<int64_t>& shape,
             std::vector<float>& values) const;
};

// tokens: calibration text; run in chunks of `chunk`; up to `sample_rows`
// input rows per product are kept for the search.
Result<AwqPlan> awq_plan(Model& bf16_model, std::span<const int32_t> tokens, int64_t chunk,
                         int64_t sample_rows, const AwqOptions& o);

}  // namespace kvant
