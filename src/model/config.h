// ModelConfig: the architecture hyper-parameters kvant's forward pass needs,
// read from GGUF metadata or a Hugging Face config.json. It knows nothing of
// weights or files beyond those two metadata forms.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/result.h"

namespace kvant {
class GgufFile;
namespace archs {
struct ArchSpec;  // model/archs/arch.h
extern const ArchSpec kLlama;
}  // namespace archs

enum class Activation { Silu, GeluTanh };
enum class RopeScaling { None, Linear, Llama3, Yarn };

struct RopeConfig {
  float theta = 10000.f;
  RopeScaling scaling = RopeScaling::None;
  float factor = 1.f;
  float low_freq_factor = 1.f;
  float high_freq_factor = 4.f;
  int64_t original_max_positions = 8192;
  // YaRN: the ramp between interpolated and extrapolated frequencies, and the
  // factor cos/sin are multiplied by (attention_factor, or one derived from
  // mscale / mscale_all_dim as transformers does).
  float beta_fast = 32.f, beta_slow = 1.f;
  float mscale = 0.f, mscale_all_dim = 0.f;
  float attn_factor = 1.f;
  bool truncate = true;
};

struct ModelConfig {
  // The family (model/archs/arch.h): its names, quirks and tensor names.
  const archs::ArchSpec* arch = &archs::kLlama;
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
  // Rotate interleaved pairs (x[2i], x[2i+1]) instead of the two halves.
  bool rope_interleave = false;

  // Multi-head latent attention (DeepSeek-V3, Kimi K2, GLM-5). The cache
  // holds per token and layer one row: the normed latent (kv_lora_rank) and
  // the RoPE key (qk_rope_dim), read as K and as V. head_dim is then the
  // query/key width qk_nope_dim + qk_rope_dim; heads = kv_heads.
  int64_t kv_lora_rank = 0;  // 0: not MLA
  int64_t q_lora_rank = 0;   // 0: queries from one q_proj
  int64_t qk_nope_dim = 0, qk_rope_dim = 0, v_head_dim = 0;
  bool mla() const { return kv_lora_rank > 0; }
  // GLM-5's sparse attention (DSA): an indexer scores the cached tokens per
  // query and attention keeps the best index_topk. Up to index_topk tokens of
  // context every token is kept, so the attention is exactly dense.
  int64_t index_topk = 0;  // 0: dense
  int64_t index_heads = 0, index_head_dim = 0;
  std::vector<uint8_t> index_full;  // per layer: 1 = runs its indexer, 0 = reuses the last one's choice
  // The KV cache row geometry: MLA caches one latent "head".
  int64_t cache_heads() const { return mla() ? 1 : kv_heads; }
  int64_t cache_dim() const { return mla() ? kv_lora_rank + qk_rope_dim : head_dim; }
  // MLA: the width of the fused first product, [q_a or q ; kv_a ; (DSA)
  // indexer wk ; indexer weights_proj].
  // Layer -1: the widest.
  int64_t mla_first_width(int64_t layer = -1) const {
    const bool idx = index_topk > 0 && (layer < 0 || index_full[size_t(layer)]);
    return (q_lora_rank > 0 ? q_lora_rank : heads * head_dim) + cache_dim() +
           (idx ? index_head_dim + index_heads : 0);
  }

  // Multi-token prediction (DeepSeek-V3, GLM-4.5: num_nextn_predict_layers):
  // MTP layers loaded (WeightOptions::mtp; 0 otherwise, whatever the
  // checkpoint has). Each is a decoder layer of its own after the main ones
  // (layer index layers + k, with KV pages of its own in the cache) plus
  // the norms and the projection that join a main hidden state with the
  // next token's embedding (ModelWeights::mtp). It drafts tokens only.
  int64_t mtp_layers = 0;
  int64_t nextn_layers = 0;  // the checkpoint's MTP layers, loaded or not
  // Layers whose K/V the cache holds: the main ones and the MTP layers.
  int64_t kv_layers() const { return layers + mtp_layers; }

  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  Result<void> validate() const;
};

Result<ModelConfig> config_from_gguf(const GgufFile& g);
Result<ModelConfig> config_from_hf_json(const std::string& config_json_path);
// The same from a parsed config.json (`path` names it in errors).
Result<ModelConfig> config_from_hf(const nlohmann::json& j, const std::string& path);

}  // namespace kvant
