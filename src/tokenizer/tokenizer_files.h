// The tokenizer that goes with a model and its chat template: from a GGUF's
// metadata, a Hugging Face directory's tokenizer.json and
// tokenizer_config.json, or the tokenizer.gguf that `kvant quantize` writes
// beside a GGUF input's weights.
#pragma once

#include <memory>
#include <string>

#include "core/result.h"
#include "io/model_files.h"
#include "tokenizer/tokenizer.h"

namespace kvant {

// From files already open for the model (a GGUF is not opened again).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFiles& files,
                                                  std::string* chat_template);
// From a path: a model file or directory, or a tokenizer of its own.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_for(const std::string& model_path,
                                                      std::string* chat_template);

}  // namespace kvant
