// Whole-checkpoint quantization: reads a GGUF file or a Hugging Face
// safetensors checkpoint (single, sharded, FP8 with block scales) and writes
// a Hugging Face directory whose block linears are compressed-tensors
// pack-quantized INT4 (docs/FORMATS.md, "INT4 weights"), or float-quantized
// FP8 e4m3 with 128x128 block scales (`<base>.weight` F8_E4M3 and
// `<base>.weight_scale` F32, amax / 448 per block: numerics/fp8_block.h). Owns which tensors
// are quantized, the output names, config.json and the tokenizer files; the
// INT4 arithmetic is rtn.h, the file formats are io/. Option parsing and
// printing are the CLI's (cli/cmd_quantize.cpp).
//
// Kept at high precision: embeddings, lm_head (unless quantize_lm_head),
// norms, biases, MoE routers (`mlp.gate.weight`), any linear whose columns
// are not a multiple of 32 (or of the group, with strict_groups; with a
// warning) and any name matching a `keep` regex. 2-D kept tensors are written as BF16; 1-D ones keep F32 when
// the input has F32 (norms load bit-identical), else BF16.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "io/safetensors_writer.h"
#include "numerics/int4.h"

namespace kvant {

enum class QuantFormat : uint8_t { kInt4, kFp8 };

struct QuantizeOptions {
  QuantFormat format = QuantFormat::kInt4;
  std::string in;   // .gguf, .safetensors, index.json, or a Hugging Face directory
  std::string out;  // directory; created if absent
  int group_size = 128;
  bool asymmetric = false;
  std::vector<std::string> keep;  // ECMAScript regexes searched in each output tensor name
  bool quantize_lm_head = false;  // with tied embeddings: writes an untied lm_head.weight
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Keep linears whose columns the group size does not divide in BF16
  // (default: quantize them with a short last group).
  bool strict_groups = false;
  // Called with every tensor's FP32 values in the output's names and layout
  // (Hugging Face, Gemma norms as w), before it is quantized or written:
  // activation-aware scaling multiplies weight columns here and divides the
  // preceding norm or rows to match.
  std::function<void(const std::string& name, const std::vector<int64_t>& shape,
                     std::vector<float>& values)>
      adjust;
  // INT4 only: quantizes one tensor (values as written, after `adjust`) in
  // place of RTN, or returns nullopt to leave it to RTN (GPTQ: gptq_plan.h).
  std::function<Result<std::optional<Int4Weight>>(const std::string& name,
                                                  const std::vector<int64_t>& shape,
                                                  const std::vector<float>& values)>
      quantize_int4;
  // Called before each tensor is converted (i counts from 1) and for warnings.
  std::function<void(size_t i, size_t n, const std::string& name, bool quantized)> progress;
  std::function<void(const std::string&)> warn;
};

struct QuantizeSummary {
  uint64_t input_bytes = 0;   // the input's weight files
  uint64_t output_bytes = 0;  // the safetensors written (headers included)
  int64_t quantized_tensors = 0;
  int64_t kept_tensors = 0;
  uint64_t quantized_bf16_bytes = 0;  // the quantized linears at 2 bytes per weight
  uint64_t quantized_int4_bytes = 0;  // the same linears as stored (INT4: packed + scales + zero
                                      // points + shape; FP8: codes + block scales)
  std::string format = "int4";        // "int4" or "fp8"
  double mean_rel_rms = 0;  // RMS(w - dequantized) / RMS(w), mean over the quantized tensors
  double max_rel_rms = 0;   // and the worst tensor
  std::vector<std::string> ignore;    // quantization_config's ignore list
  std::vector<std::string> warnings;
  std::vector<std::string> files;     // every file written, relative to `out`
  nlohmann::json to_json() const;
};

Result<QuantizeSummary> quantize_checkpoint(const QuantizeOptions& o);

}  // namespace kvant
