// The calibration pass that activation-aware scales (awq_plan.h) and GPTQ
// (gptq_plan.h) share: the BF16 model runs over calibration tokens in whole
// chunks, each chunk as one prefill from position 0, with an observer on
// every linear product's input (model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "core/result.h"
#include "model/model.h"

namespace kvant {

// Chunks of min(chunk, the model's context) tokens, as many whole ones as
// the tokens fill; `observe` sees every product's input rows and is removed
// afterwards (on errors too); `before_chunk(k)` runs before chunk k. Returns
// the rows each product saw. `what` names the caller in errors ("awq").
Result<int64_t> run_calibration(Model& model, std::span<const int32_t> tokens, int64_t chunk,
                                const char* what, Model::LinearObserver observe,
                                const std::function<void(int64_t k, int64_t chunk)>& before_chunk = {});

}  // namespace kvant
