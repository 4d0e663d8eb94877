// GPTQ for a whole dense model: runs the BF16 model on calibration tokens
// and accumulates, for each layer, the Hessian X^T X of the inputs of its
// q|k|v, o, gate|up and down products (model.h's observer; inputs rounded to
// BF16, as the products read them); then quantizes each INT4 tensor of the
// checkpoint with GPTQ (gptq.h) against its product's Hessian. With AWQ
// scales (awq_plan.h) the weight's columns are multiplied by s and its
// input divided by it, so the Hessian becomes D^-1 H D^-1, D = diag(s).
// The activations are the BF16 model's in every layer (not re-run through
// the layers already quantized).
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/model.h"
#include "numerics/int4.h"
#include "quant/gptq.h"

namespace kvant {

struct GptqPlan {
  // Hessians by product: index = layer * 4 + (0 q|k|v, 1 o, 2 gate|up, 3 down).
  std::vector<std::vector<double>> hessian;
  std::map<std::string, int64_t> tensor;  // Hugging Face weight name -> product index
  int64_t rows_seen = 0;                  // calibration rows per product
  GptqOptions opts;
  // Column scales already applied to a tensor (AWQ), by name.
  const std::map<std::string, std::vector<float>>* col_mul = nullptr;
  std::vector<std::string> report;  // one line per quantized tensor

  // GPTQ for the tensor `name` (values as written, AWQ applied), or nullopt
  // when the plan has no Hessian for it (RTN then).
  Result<std::optional<Int4Weight>> quantize(const std::string& name,
                                             const std::vector<int64_t>& shape,
                                             const std::vector<float>& values);
};

Result<GptqPlan> gptq_plan(Model& bf16_model, std::span<const int32_t> tokens, int64_t chunk,
                           const GptqOptions& o);

}  // namespace kvant
