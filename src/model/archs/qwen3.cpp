// Qwen3 (Qwen3ForCausalLM; GGUF "qwen3"): Llama with QK-norm and optional
// q/k/v biases. Qwen3-MoE (Qwen3MoeForCausalLM) adds softmax top-k routing.
#include <algorithm>
#include <vector>

#include "model/archs/hf_config.h"

namespace kvant::archs {
namespace {

Result<void> qwen3_moe_from_hf(const HfInput& in, ModelConfig& c) {
  const json& j = in.j;
  KV_TRY(read_attention_bias(in, c));
  // Softmax top-k routing; layer i is sparse unless listed in
  // mlp_only_layers, and then only every decoder_sparse_step-th.
  // transformers 5 writes num_local_experts, earlier versions num_experts.
  c.n_experts = j.value("num_experts", j.value("num_local_experts", int64_t(0)));
  c.moe_top_k = j.value("num_experts_per_tok", int64_t(0));
  c.moe_ffn = j.value("moe_intermediate_size", int64_t(0));
  c.moe_norm_topk = j.value("norm_topk_prob", false);
  if (c.n_experts <= 0 || c.moe_top_k <= 0 || c.moe_top_k > c.n_experts || c.moe_ffn <= 0)
    return make_error(in.path + ": Qwen3-MoE needs num_experts, num_experts_per_tok <= num_experts "
                                "and moe_intermediate_size");
  const int64_t step = std::max<int64_t>(1, j.value("decoder_sparse_step", int64_t(1)));
  std::vector<int64_t> dense_only;
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
    dense_only = j["mlp_only_layers"].get<std::vector<int64_t>>();
  c.moe_layer.assign(size_t(c.layers), 0);
  for (int64_t i = 0; i < c.layers; ++i)
    c.moe_layer[size_t(i)] =
        std::find(dense_only.begin(), dense_only.end(), i) == dense_only.end() && (i + 1) % step == 0;
  return {};
}

}  // namespace

extern const ArchSpec kQwen3{
    .name = "qwen3",
    .gguf_names = {"qwen3"},
    .hf_classes = {"Qwen3ForCausalLM"},
    .hf_class = "Qwen3ForCausalLM",
    .hf_model_type = "qwen3",
    .qk_norm = true,
    .from_hf = read_attention_bias,
};

extern const ArchSpec kQwen3Moe{
    .name = "qwen3_moe",
    .hf_classes = {"Qwen3MoeForCausalLM"},
    .hf_class = "Qwen3MoeForCausalLM",
    .hf_model_type = "qwen3_moe",
    .qk_norm = true,
    .from_hf = qwen3_moe_from_hf,
};

}  // namespace kvant::archs
