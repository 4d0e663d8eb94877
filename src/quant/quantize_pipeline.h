// `kvant quantize`'s pipeline: RTN, or activation-aware (AWQ) scales searched
// on the checkpoint's BF16 model over calibration tokens (awq_plan.h) and
// folded into the weights as the INT4 checkpoint is written (checkpoint.h).
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
  bool awq = false;            // else plain RTN
  // AWQ: the calibration tokens, run in chunks of calib_chunk, with up to
  // calib_rows input rows per product kept for the scale search.
  std::vector<int32_t> calib_tokens;
  std::string calib_source;  // what they came from, for the log
  int64_t calib_chunk = 512;
  int64_t calib_rows = 256;
  // AWQ's progress and per-product report, one line at a time ("awq: ...").
  std::function<void(const std::string&)> log;
};

// The BF16 model used for AWQ is let go before the checkpoint is written.
Result<QuantizeSummary> quantize_model(const QuantizePipelineOptions& o);

}  // namespace kvant
