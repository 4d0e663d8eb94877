// safetensors reader: one memory-mapped .safetensors file, its header
// validated against the file (SafetensorsFile), a shard index
// (model.safetensors.index.json), and the TensorSource over one file or a
// sharded set. Tensor bytes stay in the mappings. FP8 block scales
// (`<name>_scale_inv`) are applied by the source in read_f32_rows; this file
// does not interpret config.json (hf_config.h) or any model's names.
//
// Validation rules (docs/FORMATS.md, "Model files"): an 8-byte little-endian
// header length that fits in the file; a JSON object header with no duplicate
// keys; every tensor entry has a known dtype, non-negative integer shape and
// two data_offsets with begin <= end <= data size and end - begin equal to
// numel * dtype size; no two tensors' byte ranges overlap; __metadata__, if
// present, maps strings to strings.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/result.h"
#include "io/dtype.h"
#include "io/tensor_source.h"

namespace kvant {

inline constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;  // as the reference library

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::Unknown;
  std::vector<int64_t> shape;  // outermost first
  uint64_t offset = 0;         // absolute offset in the file
  uint64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory image (for tests and fuzzing); `bytes` must outlive the object.
  static Result<SafetensorsFile> parse(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensor* find(const std::string& name) const;
  std::span<const uint8_t> tensor_bytes(const SafetensorsTensor& t) const {
    return bytes_.subspan(t.offset, t.nbytes);
  }

 private:
  MappedFile file_;
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// model.safetensors.index.json: which shard file holds each tensor.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
};
Result<SafetensorsIndex> parse_safetensors_index(std::string_view json, const std::string& name);

// A source over already-parsed shards. `path` names the source in errors
// (the file, index or directory it came from). Fails on a tensor name held
// by two shards, or on FP8 block scales whose dtype or shape do not fit.
Result<std::unique_ptr<TensorSource>> make_safetensors_source(std::vector<SafetensorsFile> shards,
                                                              std::string path);
// Opens a .safetensors file, a model.safetensors.index.json (its shards are
// beside it; every tensor in weight_map must be in the shard it names), or
// a directory holding one of the two.
Result<std::unique_ptr<TensorSource>> open_safetensors_source(const std::string& path);

}  // namespace kvant
