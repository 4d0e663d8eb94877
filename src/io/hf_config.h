// Hugging Face config.json: read and parse only. Interpreting its fields
// (architecture, sizes, rope settings) is model/'s job.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"

namespace kvant {

// Reads `dir`/config.json; fails unless it is a JSON object. Errors name the
// file and, for bad JSON, the offset.
Result<nlohmann::json> read_hf_config(const std::string& dir);

}  // namespace kvant
