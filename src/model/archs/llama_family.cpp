// Llama and Mistral (LlamaForCausalLM, MistralForCausalLM; GGUF "llama"):
// the plain pre-norm decoder every other family departs from, with optional
// q/k/v biases. llama.cpp's converter stores the q and k rows of its GGUF
// files permuted for interleaved RoPE; the loader and the exporter undo it.
#include "model/archs/hf_config.h"

namespace kvant::archs {

extern const ArchSpec kLlama{
    .name = "llama",
    .gguf_names = {"llama"},
    .hf_classes = {"LlamaForCausalLM", "MistralForCausalLM"},
    .hf_class = "LlamaForCausalLM",
    .hf_model_type = "llama",
    .gguf_qk_permuted = true,
    .from_hf = read_attention_bias,
};

}  // namespace kvant::archs
