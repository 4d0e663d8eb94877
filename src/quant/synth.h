// `kvant synth`: a random-weight checkpoint with the structure of a real
// model's config.json, scaled down so that benchmarks can run its
// architecture on one machine. Widths (hidden, MLP and expert sizes, LoRA
// ranks, head sizes), head counts, routed experts and layers are all
// multiplied by one factor and rounded to sizes the kernels take; top-k,
// routing rules, RoPE settings and the dense/MoE layer pattern are kept.
// Output: a Hugging Face directory (config.json, BF16 safetensors), plus the
// tokenizer of a GGUF file when one is given (the vocabulary then follows
// it).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"

namespace kvant {

struct SynthOptions {
  std::string like;       // config.json or its directory
  std::string out;        // output directory (created)
  double scale = 0.125;   // factor on widths, head and expert counts, layers
  std::string tokenizer;  // optional GGUF whose tokenizer the checkpoint takes
  uint64_t seed = 1;
  float init_std = 0.02f;
  // One multi-token-prediction layer after the main ones (random, so its
  // drafts are wrong: for measuring what the MTP pass costs).
  bool mtp = false;
};

struct SynthSummary {
  nlohmann::json config;  // what was written
  int64_t params = 0;
  uint64_t bytes = 0;
};

// The scaled config (pure: no files), from the original's fields.
Result<nlohmann::json> synth_config(const nlohmann::json& like, double scale, int64_t vocab_override);

Result<SynthSummary> synth_checkpoint(const SynthOptions& o);

}  // namespace kvant
