// GGUF v3 writer for metadata-only files (no tensors): enough to carry a
// GGUF model's tokenizer (`tokenizer.*` keys) beside a safetensors export.
// Values are written with the types they were read with (GgufValue keeps
// them). It writes no tensor data; the reader is gguf.h.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "io/gguf.h"

namespace kvant {

Result<void> write_gguf_metadata(const std::string& path,
                                 const std::vector<std::pair<std::string, GgufValue>>& kv);

}  // namespace kvant
