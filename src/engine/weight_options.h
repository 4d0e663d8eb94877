// The model's weight options from the engine layer's string options
// (EngineOptions, RunnerOptions): a precision per phase ("native", "bf16",
// "fp8" or "int4") and the INT4 group and lm_head choice for quantizing at load.
// Internal to engine/: it names model/ types, which its public headers keep
// out of view.
#pragma once

#include <string>

#include "core/result.h"
#include "model/model.h"

namespace kvant {

// Errors name the bad value: a precision other than native (or empty),
// bf16, fp8 or int4, or a group other than 32, 64 or 128.
Result<WeightOptions> parse_weight_options(const std::string& prefill, const std::string& decode,
                                           int int4_group, bool int4_lm_head);

}  // namespace kvant
