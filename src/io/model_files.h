// A model path opened once: a GGUF file (parsed and mapped once) or a
// Hugging Face directory (config.json parsed once, safetensors mapped once),
// which the model's config and weights (model/loader.h) and its tokenizer
// (tokenizer/tokenizer_files.h) are all built from. Loading a model no longer
// opens the same file for each thing it needs: test ModelFiles.OpenedOnce.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"
#include "io/gguf.h"
#include "io/tensor_source.h"

namespace kvant {

class ModelFiles {
 public:
  static Result<std::shared_ptr<const ModelFiles>> open(const std::string& path);

  const std::string& path() const { return path_; }
  bool is_directory() const { return directory_; }
  const TensorSource& tensors() const { return *tensors_; }
  // The GGUF's metadata (nullptr for a directory).
  const GgufFile* gguf() const { return tensors_->gguf(); }
  // A directory's config.json (nullptr for a GGUF file).
  const nlohmann::json* hf_config() const { return directory_ ? &config_ : nullptr; }
  // The checkpoint holds compressed-tensors W4A16 linears (quantization_config).
  bool int4() const { return int4_; }
  // The checkpoint holds block-scaled FP8 linears (quantization_config
  // quant_method "fp8", as DeepSeek-V3, Kimi K2 and GLM 5 ship).
  bool fp8() const { return fp8_; }

  // How many ModelFiles this process has opened (tests: one per load).
  static int64_t opened() { return opened_.load(); }

 private:
  std::string path_;
  bool directory_ = false, int4_ = false, fp8_ = false;
  nlohmann::json config_;
  std::unique_ptr<TensorSource> tensors_;
  static inline std::atomic<int64_t> opened_{0};
};

}  // namespace kvant
