// Loads a model (config + weights) from a GGUF file or a Hugging Face
// directory through io/'s TensorSource, mapping each file's tensor names to
// kvant's parameters. Knows file naming conventions, not file formats.
#pragma once

#include <string>

#include "core/result.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvant {

struct LoadedModel {
  ModelConfig config;
  ModelWeights weights;
};

Result<LoadedModel> load_model(const std::string& path);

}  // namespace kvant
