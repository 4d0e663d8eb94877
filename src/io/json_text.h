// Strict JSON parsing for model files (safetensors headers, shard indexes,
// config.json). Owns the checks nlohmann::json leaves to the caller:
// duplicate keys (nlohmann silently keeps the last) and nesting depth (a
// hostile header of a million '[' would otherwise cost memory per level).
// It does not know any schema; callers validate fields themselves.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/result.h"

namespace kvant {

inline constexpr int kMaxJsonDepth = 64;

// Parses `text`. Errors start with `what` and give the offset of the fault
// as `base_offset` + its position in `text` (so a safetensors header reports
// file offsets).
Result<nlohmann::json> parse_json_text(std::string_view text, const std::string& what,
                                       uint64_t base_offset = 0);

// Reads and parses a whole JSON file.
Result<nlohmann::json> read_json_file(const std::string& path);

}  // namespace kvant
