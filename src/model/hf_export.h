// The reverse of the loader's GGUF conventions, for writing a GGUF model
// out as a Hugging Face checkpoint: the HF name of each GGUF tensor, the
// transform that takes its values to HF's convention (llama.cpp permutes
// Llama q/k rows for interleaved RoPE; Gemma GGUF norms hold 1 + w where HF
// holds w), and a config.json that config_from_hf_json reads back as the
// same ModelConfig. It reads and writes no files.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"
#include "model/config.h"

namespace kvant {

struct GgufToHf {
  std::string hf_name;
  int64_t unpermute_heads = 0;  // > 0: undo llama.cpp's q/k row permutation (heads of head_dim rows)
  float add = 0.f;              // added to every value (Gemma norms: -1)
};

// Fails on a tensor kvant's loader does not know (the error names it).
Result<GgufToHf> gguf_to_hf(const std::string& gguf_name, const ModelConfig& c);

// Undoes the permutation in place: v is [heads * head_dim, cols] row-major.
void unpermute_gguf_qk_rows(float* v, int64_t heads, int64_t head_dim, int64_t cols);

// config.json for `c` (architectures, model_type, sizes, RoPE, the family's
// own fields such as Gemma's sliding window and layer types, ids), with
// torch_dtype bfloat16.
nlohmann::json hf_config_json(const ModelConfig& c);

// Shortest decimal that reads back as the same float, so 1e-5f is written
// as 1e-05 rather than 9.999999747378752e-06.
double short_float(float f);

}  // namespace kvant
