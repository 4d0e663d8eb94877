// The list of architecture families (registry.h). A new family: its file in
// model/archs/ defining its ArchSpec, and its entry here (declaration and
// list line). An explicit list: specs that registered themselves from static
// initializers would be dropped by the linker along with the object files
// nothing else references.
#include "model/archs/registry.h"

namespace kvant::archs {

extern const ArchSpec kLlama, kQwen2, kQwen3, kQwen3Moe, kGemma3, kGlm4Moe, kDeepseekV3, kGlmMoeDsa;

namespace {

// One entry per family; errors list the names in this order.
constexpr const ArchSpec* kAll[] = {
    &kLlama,       // llama_family.cpp: Llama, Mistral
    &kQwen2,       // qwen2.cpp
    &kQwen3,       // qwen3.cpp
    &kQwen3Moe,    // qwen3.cpp
    &kGemma3,      // gemma3.cpp
    &kGlm4Moe,     // glm4_moe.cpp: GLM-4.5
    &kDeepseekV3,  // deepseek_v3.cpp: DeepSeek-V3, Kimi K2
    &kGlmMoeDsa,   // deepseek_v3.cpp: GLM-5
};

bool has(const NameList& names, std::string_view n) {
  for (const char* s : names)
    if (s && n == s) return true;
  return false;
}

std::string list(NameList ArchSpec::*names) {
  std::string out;
  for (const ArchSpec* a : kAll)
    for (const char* s : a->*names)
      if (s) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

}  // namespace

std::span<const ArchSpec* const> all_archs() { return kAll; }

const ArchSpec* arch_from_gguf(std::string_view general_architecture) {
  for (const ArchSpec* a : kAll)
    if (has(a->gguf_names, general_architecture)) return a;
  return nullptr;
}

const ArchSpec* arch_from_hf(std::string_view hf_class) {
  for (const ArchSpec* a : kAll)
    if (has(a->hf_classes, hf_class)) return a;
  return nullptr;
}

std::string gguf_arch_list() { return list(&ArchSpec::gguf_names); }
std::string hf_arch_list() { return list(&ArchSpec::hf_classes); }

}  // namespace kvant::archs
