// Block geometry per ggml type follows the GGUF specification: e.g. Q4_K packs
// 256 weights into 144 bytes (two fp16 super-scales, 12 bytes of 6-bit scales
// and mins, 128 bytes of nibbles).
#include "io/dtype.h"

#include <cstdint>

namespace kvant {

const DTypeInfo& dtype_info(DType t) {
  static const DTypeInfo table[] = {
      {"F32", 1, 4},      {"F16", 1, 2},      {"BF16", 1, 2},     {"F64", 1, 8},
      {"I8", 1, 1},       {"I16", 1, 2},      {"I32", 1, 4},      {"I64", 1, 8},
      {"U8", 1, 1},       {"F8_E4M3", 1, 1},  {"F8_E5M2", 1, 1},  {"Q4_0", 32, 18},
      {"Q4_1", 32, 20},   {"Q5_0", 32, 22},   {"Q5_1", 32, 24},   {"Q8_0", 32, 34},
      {"Q2_K", 256, 84},  {"Q3_K", 256, 110}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176},
      {"Q6_K", 256, 210}, {"Q8_K", 256, 292}, {"unknown", 0, 0},
  };
  static_assert(sizeof(table) / sizeof(table[0]) == size_t(DType::Unknown) + 1);
  return table[size_t(t)];
}

size_t dtype_bytes(DType t, uint64_t n) {
  const auto& i = dtype_info(t);
  if (i.block_elems == 0 || n % i.block_elems != 0) return SIZE_MAX;
  return size_t(n / i.block_elems) * i.block_bytes;
}

DType dtype_from_ggml(uint32_t g) {
  switch (g) {
    case 0:
      return DType::F32;
    case 1:
      return DType::F16;
    case 2:
      return DType::Q4_0;
    case 3:
      return DType::Q4_1;
    case 6:
      return DType::Q5_0;
    case 7:
      return DType::Q5_1;
    case 8:
      return DType::Q8_0;
    case 10:
      return DType::Q2_K;
    case 11:
      return DType::Q3_K;
    case 12:
      return DType::Q4_K;
    case 13:
      return DType::Q5_K;
    case 14:
      return DType::Q6_K;
    case 15:
      return DType::Q8_K;
    case 24:
      return DType::I8;
    case 25:
      return DType::I16;
    case 26:
      return DType::I32;
    case 27:
      return DType::I64;
    case 28:
      return DType::F64;
    case 30:
      return DType::BF16;
    default:
      return DType::Unknown;
  }
}

DType dtype_from_safetensors(const std::string& s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F64") return DType::F64;
  if (s == "I8") return DType::I8;
  if (s == "I16") return DType::I16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "F8_E5M2") return DType::F8_E5M2;
  return DType::Unknown;
}

}  // namespace kvant
