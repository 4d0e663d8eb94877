// compressed-tensors `pack-quantized` W4A16 checkpoints: the
// "quantization_config" object of config.json, and the tensors of one
// group-wise INT4 linear layer (docs/FORMATS.md, "INT4 weights"):
//   <base>.weight_packed      I32 [rows, ceil(cols/8)]   nibble q+8, element i of a word at bits [4i, 4i+4)
//   <base>.weight_scale       BF16 [rows, ceil(cols/group)] (F16/F32 accepted when reading)
//   <base>.weight_shape       I32 [2] = {rows, cols}     (I64 accepted when reading)
//   <base>.weight_zero_point  I32 [ceil(rows/8), ceil(cols/group)], asymmetric only, packed along rows
// Owns the layout and its validation, in both directions. It does not
// choose q, scales or zero points (numerics/int4_rtn.h) or multiply anything out
// (the kernels).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "numerics/int4.h"
#include "io/safetensors_writer.h"
#include "io/tensor_source.h"

namespace kvant {

struct Int4Scheme {
  int group_size = 128;
  bool symmetric = true;
  std::vector<std::string> ignore;  // as in config.json ("lm_head", "re:..." patterns kept verbatim)
};

// config.json's "quantization_config": nullopt when absent; an error when
// present but not a 4-bit int group-wise pack-quantized compressed-tensors
// scheme kvant can run (the error says what it is).
Result<std::optional<Int4Scheme>> parse_quantization_config(const nlohmann::json& config_json);
// The object to put under "quantization_config".
nlohmann::json quantization_config_json(const Int4Scheme& s);

// FP8 e4m3 weights (tensor_source.h reads their scales): config.json's
// quantization_config is DeepSeek-V3's quant_method "fp8", or
// compressed-tensors whose every config group quantizes weights to 8-bit
// float (format float-quantized; per tensor, channel or 128x128 block).
// Activation schemes are not applied: kvant computes with BF16 activations.
bool is_fp8_quantization_config(const nlohmann::json& config_json);
// compressed-tensors float-quantized, 8-bit float weights in 128x128 blocks
// (the object under "quantization_config"; `ignore` lists modules kept BF16).
nlohmann::json fp8_quantization_config_json(const std::vector<std::string>& ignore);

// base: a linear's name without suffix, e.g. "model.layers.0.mlp.down_proj".
bool has_int4_weight(const TensorSource& src, const std::string& base);  // base + ".weight_packed" exists
Result<Int4Weight> read_int4_weight(const TensorSource& src, const std::string& base);

// Writer side. The specs (for SafetensorsWriter::create) of the tensors of a
// [rows, cols] linear, in the order int4_weight_tensors returns them.
std::vector<TensorSpec> int4_weight_specs(const std::string& base, int64_t rows, int64_t cols,
                                          int64_t group, bool asymmetric);
// The stored tensors of `w`. `w` must be consistent (sizes, value ranges,
// ceil(cols / group) scales per row); a violation is a bug and aborts.
std::vector<TensorData> int4_weight_tensors(const std::string& base, const Int4Weight& w);
// Bytes of those tensors (packed + scales + zero points + shape).
uint64_t int4_weight_bytes(int64_t rows, int64_t cols, int64_t group, bool asymmetric);

}  // namespace kvant
