// The KL baseline file of `kvant eval` (--kl-save writes it from a reference
// run, --kl-baseline reads it): "KVKL1\n", one JSON header line, then one
// fixed-size record per window. docs/FORMATS.md describes it in full.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"

namespace kvant::eval {

// Record: int64 start; W int32 tokens; per scored position: float logprob of
// the actual next token, K int32 ids, K float log-probabilities (most likely
// first).
struct KlHeader {
  nlohmann::json j;
  int64_t window = 0, score = 0, k = 0, windows = 0;
  size_t header_bytes = 0;
  size_t record_bytes() const {
    return 8 + size_t(window) * 4 + size_t(score) * (4 + size_t(k) * 8);
  }
};

// Reads the magic and header of an open file; `windows` counts the whole
// records that follow.
Result<KlHeader> read_kl_header(std::ifstream& f, const std::string& path);
// Starts the baseline at `path` with `header`, or, resuming, keeps a file
// whose header equals it: the header's byte size, and in *have the whole
// windows the file already holds (0 for a fresh file).
Result<KlHeader> open_kl_save(const std::string& path, const nlohmann::json& header, bool resume,
                              size_t* have);

}  // namespace kvant::eval
