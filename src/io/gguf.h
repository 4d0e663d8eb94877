// GGUF v2/v3 reader: parses the header, metadata and tensor directory of a
// memory-mapped file and validates every length and offset against the file
// size. Tensor data stays in the mapping; dequantization is in dequant.h.
// Errors name the file, the field or tensor, and the byte offset.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/result.h"
#include "io/dtype.h"

namespace kvant {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // arrays only
  // Scalars: integers in i (unsigned values that fit) or u, floats in f.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  // Arrays: strings in strs, every numeric or bool element in nums.
  std::vector<std::string> strs;
  std::vector<double> nums;
  bool is_array() const { return type == GgufType::Array; }
  bool is_string() const { return type == GgufType::String; }
  bool is_number() const;
  double as_double() const;  // any numeric scalar or bool
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> shape;  // outermost first (numpy order): GGUF's ne reversed
  DType dtype = DType::Unknown;
  uint32_t ggml_type = 0;
  uint64_t offset = 0;  // absolute offset in the file
  uint64_t nbytes = 0;
  int64_t numel() const;
};

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);
  // How many files open() has mapped in this process (tests: a model loads
  // its GGUF once, io/model_files.h).
  static int64_t opened() { return opened_.load(); }
  // Parses an in-memory image (for tests and fuzzing); `bytes` must outlive the object.
  static Result<GgufFile> parse(std::span<const uint8_t> bytes, const std::string& name);

  uint32_t version() const { return version_; }
  const std::string& path() const { return name_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufValue* find(const std::string& key) const;
  const GgufTensor* find_tensor(const std::string& name) const;
  std::span<const uint8_t> tensor_bytes(const GgufTensor& t) const {
    return bytes_.subspan(t.offset, t.nbytes);
  }

  // Typed look-ups; nullopt when absent or of another kind.
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<double> get_number(const std::string& key) const;
  std::optional<int64_t> get_int(const std::string& key) const;
  const std::vector<std::string>* get_strings(const std::string& key) const;
  const std::vector<double>* get_numbers(const std::string& key) const;

 private:
  MappedFile file_;
  std::span<const uint8_t> bytes_;
  std::string name_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
  static inline std::atomic<int64_t> opened_{0};
};

}  // namespace kvant
