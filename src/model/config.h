// ModelConfig: the architecture hyper-parameters kvant's forward pass needs,
// read from GGUF metadata or a Hugging Face config.json. It knows nothing of
// weights or files beyond those two metadata forms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace kvant {
class GgufFile;

enum class Arch { Llama, Qwen2, Qwen3, Gemma3, Glm4Moe };
enum class Activation { Silu, GeluTanh };
enum class RopeScaling { None, Linear, Llama3 };

struct RopeConfig {
  float theta = 10000.f;
  RopeScaling scaling = RopeScaling::None;
  float factor = 1.f;
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int64_t original_max_positions = 8192;
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;  // as the file names it ("llama", "LlamaForCausalLM", ...)
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  int64_t max_positions = 0;
  float rms_eps = 1e-5f;
  Activation act = Activation::Silu;
  bool tie_embeddings = false;
  bool qkv_bias = false;    // Qwen2
  bool qk_norm = false;     // Qwen3, Gemma 3: RMSNorm over each head of q and k
  bool post_norms = false;  // Gemma 3: norms after attention and after the MLP
  float embed_scale = 1.f;  // Gemma: sqrt(hidden)
  float attn_scale = 0.f;   // softmax scale; head_dim^-0.5 unless the model says
  float final_softcap = 0.f;
  float attn_softcap = 0.f;
  int64_t sliding_window = 0;      // 0 = none
  std::vector<uint8_t> sliding;    // per layer: 1 = sliding-window attention
  RopeConfig rope;                 // global (full-attention) layers
  RopeConfig rope_local;           // sliding layers (Gemma 3 uses another base)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  // Mixture of experts (0 experts: every layer dense). moe_layer[i] = 1 where
  // layer i's MLP is the routed one.
  int64_t n_experts = 0;
  int64_t moe_top_k = 0;
  int64_t moe_ffn = 0;  // each expert's intermediate size
  bool moe_norm_topk = false;
  std::vector<uint8_t> moe_layer;
  bool moe_sigmoid = false;     // sigmoid scores + correction bias (else softmax)
  int64_t moe_n_group = 1, moe_topk_group = 1;
  float moe_scaling = 1.f;      // routed_scaling_factor
  int64_t moe_shared_ffn = 0;   // shared experts' intermediate size (0: none)
  // RoPE on the first rotary_dim values of each head (GLM-4.5: half); 0 = all.
  int64_t rotary_dim = 0;
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  Result<void> validate() const;
};

Result<ModelConfig> config_from_gguf(const GgufFile& g);
Result<ModelConfig> config_from_hf_json(const std::string& config_json_path);
const char* arch_name(Arch a);

}  // namespace kvant
