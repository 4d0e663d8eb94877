// safetensors writer for checkpoints larger than memory: every tensor's
// name, dtype and shape is declared up front, so the shard split and every
// header are fixed before the first byte is written; then each tensor's
// bytes are written in declaration order and only that tensor is in memory.
// Shards above `max_shard_bytes` become model-0000N-of-0000M.safetensors
// plus model.safetensors.index.json; a checkpoint that fits is one
// model.safetensors. Headers are padded with spaces so the data starts on an
// 8-byte boundary, as the reference library does, and carry
// "__metadata__": {"format": "pt"}. It does not convert dtypes (callers
// hand it the stored bytes) and it reads nothing (safetensors.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "io/dtype.h"

namespace kvant {

struct TensorSpec {
  std::string name;
  DType dtype = DType::Unknown;
  std::vector<int64_t> shape;  // outermost first
  uint64_t nbytes() const;     // numel * element size
};

// A tensor with its stored bytes (little-endian), ready for the writer.
struct TensorData {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

class SafetensorsWriter {
 public:
  // Plans the shards of `specs` (in this order) under directory `dir`, which
  // must exist. Fails on duplicate names, an unsupported dtype (block-
  // quantized GGUF types have no safetensors name) or a negative dimension.
  static Result<SafetensorsWriter> create(const std::string& dir, std::vector<TensorSpec> specs,
                                          uint64_t max_shard_bytes = kDefaultMaxShardBytes);
  SafetensorsWriter(SafetensorsWriter&& o) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& o) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Writes the next declared tensor; `name` must be that tensor and `bytes`
  // its exact size.
  Result<void> write(const std::string& name, std::span<const uint8_t> bytes);
  // After the last tensor: closes the last shard and writes the index when
  // there are several. Fails if a declared tensor was not written.
  Result<void> finish();

  const std::vector<std::string>& files() const { return files_; }  // shard file names
  uint64_t total_bytes() const;  // all shard files, headers included

 private:
  SafetensorsWriter() = default;
  Result<void> open_shard(size_t s);
  Result<void> close_shard();

  std::string dir_;
  std::vector<TensorSpec> specs_;
  std::vector<size_t> shard_of_;              // per tensor
  std::vector<std::string> files_;            // per shard
  std::vector<std::string> headers_;          // per shard: 8-byte length + padded JSON
  std::vector<uint64_t> shard_data_bytes_;    // per shard
  size_t next_ = 0;
  size_t open_ = SIZE_MAX;
  std::FILE* f_ = nullptr;
  bool finished_ = false;
};

// The safetensors dtype name of `t` ("BF16", "I32", ...), or nullptr when
// the format has none.
const char* safetensors_dtype_name(DType t);

}  // namespace kvant
