// TensorSource: what a model loader sees of a checkpoint, whatever its file
// format (GGUF, safetensors single or sharded). Names are the file's own;
// mapping them to a model's parameters is model/'s job.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "io/dtype.h"

namespace kvant {

class GgufFile;

struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;  // outermost first, e.g. a linear weight is [out, in]
  DType dtype = DType::Unknown;
  std::span<const uint8_t> data;  // raw bytes inside the mapped file
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::string& path() const = 0;
  virtual const std::vector<TensorRef>& tensors() const = 0;
  virtual const TensorRef* find(const std::string& name) const = 0;
  // The parsed file behind a GGUF source (its metadata), else nullptr.
  virtual const GgufFile* gguf() const { return nullptr; }
  // Dequantizes a whole tensor to FP32; `out` holds numel() values. FP8
  // weights with a `<name>_scale_inv` or `<name>_scale` sibling get their
  // scales (per 128x128 block, per row or per tensor).
  // Errors name the file and tensor.
  Result<void> read_f32(const TensorRef& t, std::span<float> out) const {
    return read_f32_rows(t, 0, num_rows(t), out);
  }
  // Dequantizes rows [begin, end) to FP32, a row being the innermost
  // dimension (shape.back() values; a 0-d tensor is one row of one value).
  // Loaders split big tensors over threads with this; every call is
  // independent and const, so concurrent calls are safe. `out` holds
  // (end - begin) * row_length(t) values.
  virtual Result<void> read_f32_rows(const TensorRef& t, int64_t begin, int64_t end,
                                     std::span<float> out) const = 0;

  // A 2-D F8_E4M3 weight's scales, for loaders that keep its codes: the
  // scale tensor (F32 or BF16, checked at open; nullptr: no scales, each
  // code is its value) and the rows and columns one scale covers: 128 x 128
  // blocks (DeepSeek-V3 `_scale_inv`, compressed-tensors "block"), 1 x C
  // (per channel) or R x C (per tensor). nullopt for any other tensor.
  struct Fp8Scales {
    const TensorRef* scales = nullptr;
    int64_t block_rows = 0, block_cols = 0;
  };
  virtual std::optional<Fp8Scales> fp8_scales(const TensorRef& t) const { return std::nullopt; }
  static constexpr int64_t kFp8ScaleBlock = 128;

  static int64_t row_length(const TensorRef& t) { return t.shape.empty() ? 1 : t.shape.back(); }
  static int64_t num_rows(const TensorRef& t) {
    const int64_t len = row_length(t);
    return len == 0 ? 0 : t.numel() / len;
  }
};

// Opens a .gguf file, a .safetensors file, or a Hugging Face directory
// (model.safetensors or model.safetensors.index.json).
Result<std::unique_ptr<TensorSource>> open_tensor_source(const std::string& path);

}  // namespace kvant
