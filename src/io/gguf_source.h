// TensorSource over a parsed GGUF file. Owns the GgufFile (and so its
// mapping) and presents its tensors with GGUF's own names and shapes
// (outermost first). It does not rename tensors or undo GGUF-specific
// layouts such as llama.cpp's permuted Q/K rows; that is model/'s job.
#pragma once

#include <memory>
#include <string>

#include "core/result.h"
#include "io/gguf.h"
#include "io/tensor_source.h"

namespace kvant {

// Wraps an already-parsed file (GgufFile::open or GgufFile::parse).
std::unique_ptr<TensorSource> make_gguf_source(GgufFile file);
Result<std::unique_ptr<TensorSource>> open_gguf_source(const std::string& path);

}  // namespace kvant
