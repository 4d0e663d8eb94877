// Helpers the model's blocks share (model/blocks/*.cpp): the RoPE
// frequencies of a config and the activation of the gated MLPs.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace kvant {

// Inverse frequencies [dim/2] of a RoPE config (linear, Llama 3 and YaRN
// scaling as transformers computes them), divided by per-pair factors when
// the checkpoint has them (Llama 3 GGUF).
std::vector<float> rope_inv_freq(const RopeConfig& r, int64_t dim, const std::vector<float>& factors);

inline backend::GateAct gate_act(Activation a) {
  return a == Activation::GeluTanh ? backend::GateAct::kGeluTanh : backend::GateAct::kSilu;
}

}  // namespace kvant
