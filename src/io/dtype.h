// Storage dtypes of tensors in model files (GGUF ggml types and safetensors
// dtypes), with their block geometry. Dequantization lives in dequant.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvant {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  F64,
  I8,
  I16,
  I32,
  I64,
  U8,
  F8_E4M3,
  F8_E5M2,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  Q8_K,
  Unknown,
};

struct DTypeInfo {
  const char* name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
};

const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
// Bytes for n elements, or SIZE_MAX when n is not a multiple of the block.
size_t dtype_bytes(DType t, uint64_t n);
// ggml type id -> DType (Unknown for ids kvant cannot read).
DType dtype_from_ggml(uint32_t ggml_type);
// safetensors dtype string ("BF16", "F8_E4M3", ...) -> DType.
DType dtype_from_safetensors(const std::string& s);

}  // namespace kvant
