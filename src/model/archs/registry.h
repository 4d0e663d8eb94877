// The architecture families kvant runs (registry.cpp lists their specs),
// looked up by the names files give them.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "model/archs/arch.h"

namespace kvant::archs {

// Every family's spec, in the list's order.
std::span<const ArchSpec* const> all_archs();
// The family that reads a GGUF general.architecture value, or a config.json
// architectures[0] class name; null when none does.
const ArchSpec* arch_from_gguf(std::string_view general_architecture);
const ArchSpec* arch_from_hf(std::string_view hf_class);
// The names read, for errors: "llama, qwen2, ...".
std::string gguf_arch_list();
std::string hf_arch_list();

}  // namespace kvant::archs
