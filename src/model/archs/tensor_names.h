// The one table of tensor names for the dense parts every family shares:
// each parameter's role ("wq", "ffn_norm", ...) and its name in a GGUF file
// and in a Hugging Face checkpoint; the names families differ in (Gemma 3's
// norms around attention and the MLP) come from each family's spec
// (ArchSpec::hf_role_names). The loader reads through it, the Hugging Face
// exporter maps GGUF names through it, and the AWQ planner names the tensors
// it rescales through it. Mixture-of-experts, latent and sparse attention
// tensors load from Hugging Face checkpoints only; their names stay with the
// loader's blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/archs/arch.h"

namespace kvant::archs {

enum class Naming { Gguf, Hf };

// A layer's tensor for a role, or "" when the family has none.
std::string layer_tensor(Naming n, const ArchSpec& a, int64_t layer, std::string_view role);
// The model's own tensors: "embed", "out_norm", "output", "rope_freqs" ("" when none).
std::string global_tensor(Naming n, std::string_view role);
// A norm's weight (GGUF files of Gemma store 1 + w, Hugging Face w).
bool role_is_norm(std::string_view role);

// The role (and layer, -1 for the model's own) of a file's tensor name.
struct TensorRole {
  std::string role;
  int64_t layer = -1;
};
std::optional<TensorRole> tensor_role(Naming n, std::string_view name);

}  // namespace kvant::archs
