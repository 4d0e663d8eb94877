// `kvant quantize`'s pipeline: RTN, or activation-aware (AWQ) scales searched
// on the checkpoint's BF16 model over calibration tokens (awq_plan.h) and
// folded into the weights as the INT4 checkpoint is written (checkpoint.h),
// and/or GPTQ rounding against the Hessians of the same model's product
// inputs (gptq_plan.h).
// The CLI parses options, tokenizes the calibration text and prints; this
// loads the model and runs the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/result.h"
#include "quant/checkpoint.h"

namespace kvant {

struct QuantizePipelineOptions {
  QuantizeOptions checkpoint;  // in, out, group, asymmetry, ...; AWQ sets its `adjust`
  bool awq = false;            // activation-aware scales
  bool gptq = false;           // GPTQ rounding (with or without AWQ scales); else RTN
  double gptq_damp = 0.01;
  bool gptq_act_order = false;
  double gptq_sink_weight = 1.0;
  // Group ranges by a clip search (numerics/int4_rtn.h,
  // int4_group_params_clipped): GPTQ weighs each column's error by its
  // Hessian diagonal, AWQ by its input's mean square (RTN: unweighted).
  bool clip = false;
  // AWQ / GPTQ: the calibration tokens, run in chunks of calib_chunk; AWQ
  // keeps up to calib_rows input rows per product for its scale search,
  // GPTQ accumulates every row into the products' Hessians.
  std::vector<int32_t> calib_tokens;
  std::string calib_source;  // what they came from, for the log
  int64_t calib_chunk = 512;
  int64_t calib_rows = 256;
  // AWQ's and GPTQ's progress and per-product report, one line at a time.
  std::function<void(const std::string&)> log;
};

// The BF16 model used for AWQ is let go before the checkpoint is written.
Result<QuantizeSummary> quantize_model(const QuantizePipelineOptions& o);

}  // namespace kvant
