// Qwen2 (Qwen2ForCausalLM; GGUF "qwen2"): Llama with biases on q, k and v.
#include "model/archs/hf_config.h"

namespace kvant::archs {

extern const ArchSpec kQwen2{
    .name = "qwen2",
    .gguf_names = {"qwen2"},
    .hf_classes = {"Qwen2ForCausalLM"},
    .hf_class = "Qwen2ForCausalLM",
    .hf_model_type = "qwen2",
    .qkv_bias = true,
};

}  // namespace kvant::archs
