// ArchSpec: everything kvant knows of one architecture family, as data. Each
// family's file in model/archs/ defines its spec (llama_family.cpp,
// qwen2.cpp, qwen3.cpp, gemma3.cpp, glm4_moe.cpp, deepseek_v3.cpp) and
// registry.cpp lists them; the config parser, the loader, the Hugging Face
// exporter and the AWQ planner read a model's spec (ModelConfig::arch) and
// never ask which family it is.
#pragma once

#include <array>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/result.h"

namespace kvant {
class GgufFile;
struct ModelConfig;
}  // namespace kvant

namespace kvant::archs {

// A layer role's Hugging Face name (after "model.layers.N.") where families
// name it differently; the shared table (tensor_names.cpp) leaves those "".
struct RoleName {
  const char* role = nullptr;
  const char* hf = nullptr;
};
using RoleNames = std::array<RoleName, 4>;  // unused slots null
// Llama's: "post_attention_layernorm" is the norm before the MLP (every
// family's but Gemma 3's).
inline constexpr RoleNames kLlamaRoleNames = {{{"ffn_norm", "post_attention_layernorm.weight"}}};

// The names a family is known by in a file; unused slots null.
using NameList = std::array<const char*, 4>;

// What config_from_hf hands a family: the parsed config.json, the merged RoPE
// block (rope_parameters, with rope_scaling over it), the top-level
// rope_theta, and the file's path for errors.
struct HfInput {
  const nlohmann::json& j;
  const nlohmann::json& rope;
  float theta;
  const std::string& path;
};

struct ArchSpec {
  const char* name = "";           // the family ("llama", "gemma3", ...)
  NameList gguf_names = {};        // general.architecture values read (none: Hugging Face only)
  NameList hf_classes = {};        // config.json architectures[0] values read
  const char* hf_class = "";       // what the exporter writes as architectures[0] ...
  const char* hf_model_type = "";  // ... and as model_type

  // Switches the family always has on, whatever the file says (its mapping
  // functions below set those it reads from the file).
  bool qkv_bias = false;    // biases on q, k, v (Qwen2)
  bool qk_norm = false;     // RMSNorm over each head of q and k
  bool post_norms = false;  // norms after attention and after the MLP (Gemma 3)
  // tie_word_embeddings when config.json does not say.
  bool hf_tie_default = false;
  // Hugging Face norm weights hold w and the forward computes x*(1+w); GGUF
  // files and kvant hold 1+w (Gemma).
  bool hf_norm_plus_one = false;
  // GGUF files hold q/k rows permuted for interleaved RoPE (llama.cpp's
  // converter does so for Llama); kvant uses the half-split rotation.
  bool gguf_qk_permuted = false;
  // The family's Hugging Face names for the roles the shared table leaves to it.
  RoleNames hf_role_names = kLlamaRoleNames;

  // config.json: the family's fields beyond the common ones config.cpp reads.
  // config.cpp has set the RoPE from the merged block beforehand; a family
  // that leaves act at SiLU has hidden_act checked to be "silu" afterwards.
  // Null: nothing more.
  Result<void> (*from_hf)(const HfInput& in, ModelConfig& c) = nullptr;
  // GGUF metadata ("<prefix>.<field>" keys): the family's fields beyond the
  // common ones. Null: nothing more.
  void (*from_gguf)(const GgufFile& g, const std::string& prefix, ModelConfig& c) = nullptr;
  // The exporter's config.json: the family's fields beyond the common ones.
  // Null: hidden_act "silu" and attention_bias.
  void (*to_hf)(const ModelConfig& c, nlohmann::ordered_json& j) = nullptr;
};

// The family a ModelConfig starts as (llama_family.cpp).
extern const ArchSpec kLlama;

}  // namespace kvant::archs
