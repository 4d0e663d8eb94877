// The shared tensor-name table (tensor_names.h).
#include "model/archs/tensor_names.h"

namespace kvant::archs {
namespace {

struct Row {
  const char* role;
  const char* gguf;  // after "blk.N."
  const char* hf;    // after "model.layers.N."; "" where the family decides (below)
  bool norm;
};

constexpr Row kLayer[] = {
    {"attn_norm", "attn_norm.weight", "input_layernorm.weight", true},
    {"wq", "attn_q.weight", "self_attn.q_proj.weight", false},
    {"wk", "attn_k.weight", "self_attn.k_proj.weight", false},
    {"wv", "attn_v.weight", "self_attn.v_proj.weight", false},
    {"bq", "attn_q.bias", "self_attn.q_proj.bias", false},
    {"bk", "attn_k.bias", "self_attn.k_proj.bias", false},
    {"bv", "attn_v.bias", "self_attn.v_proj.bias", false},
    {"q_norm", "attn_q_norm.weight", "self_attn.q_norm.weight", true},
    {"k_norm", "attn_k_norm.weight", "self_attn.k_norm.weight", true},
    {"wo", "attn_output.weight", "self_attn.o_proj.weight", false},
    {"post_attn_norm", "post_attention_norm.weight", "", true},
    {"ffn_norm", "ffn_norm.weight", "", true},
    {"w_gate", "ffn_gate.weight", "mlp.gate_proj.weight", false},
    {"w_up", "ffn_up.weight", "mlp.up_proj.weight", false},
    {"w_down", "ffn_down.weight", "mlp.down_proj.weight", false},
    {"post_ffn_norm", "post_ffw_norm.weight", "", true},
};

struct Global {
  const char* role;
  const char* gguf;
  const char* hf;
};
constexpr Global kGlobal[] = {
    {"embed", "token_embd.weight", "model.embed_tokens.weight"},
    {"out_norm", "output_norm.weight", "model.norm.weight"},
    {"output", "output.weight", "lm_head.weight"},
    {"rope_freqs", "rope_freqs.weight", ""},
};

// Hugging Face names that depend on the family (ArchSpec::hf_role_names).
// Llama's "post_attention_layernorm" is the norm before the MLP; Gemma's is
// the norm applied to the attention output, and it has one around the MLP too.
std::string hf_family_name(const ArchSpec& a, std::string_view role) {
  for (const RoleName& r : a.hf_role_names)
    if (r.role && role == r.role) return r.hf;
  return "";
}

}  // namespace

std::string layer_tensor(Naming n, const ArchSpec& a, int64_t layer, std::string_view role) {
  for (const Row& r : kLayer) {
    if (role != r.role) continue;
    if (n == Naming::Gguf) return "blk." + std::to_string(layer) + "." + r.gguf;
    const std::string hf = *r.hf ? std::string(r.hf) : hf_family_name(a, role);
    return hf.empty() ? "" : "model.layers." + std::to_string(layer) + "." + hf;
  }
  return "";
}

std::string global_tensor(Naming n, std::string_view role) {
  for (const Global& g : kGlobal)
    if (role == g.role) return n == Naming::Gguf ? g.gguf : g.hf;
  return "";
}

bool role_is_norm(std::string_view role) {
  if (role == "out_norm") return true;
  for (const Row& r : kLayer)
    if (role == r.role) return r.norm;
  return false;
}

std::optional<TensorRole> tensor_role(Naming n, std::string_view name) {
  for (const Global& g : kGlobal)
    if (name == (n == Naming::Gguf ? g.gguf : g.hf) && *(n == Naming::Gguf ? g.gguf : g.hf))
      return TensorRole{g.role, -1};
  const std::string_view prefix = n == Naming::Gguf ? "blk." : "model.layers.";
  if (!name.starts_with(prefix)) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string_view::npos || dot == prefix.size()) return std::nullopt;
  int64_t layer = 0;
  for (char ch : name.substr(prefix.size(), dot - prefix.size())) {
    if (ch < '0' || ch > '9') return std::nullopt;
    layer = layer * 10 + (ch - '0');
  }
  const std::string_view rest = name.substr(dot + 1);
  for (const Row& r : kLayer) {
    if (n == Naming::Gguf && rest == r.gguf) return TensorRole{r.role, layer};
    if (n == Naming::Hf && *r.hf && rest == r.hf) return TensorRole{r.role, layer};
  }
  return std::nullopt;
}

}  // namespace kvant::archs
