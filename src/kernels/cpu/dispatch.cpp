// Chooses the kernel table once from cpuid (and KVANT_ISA). SIMD tables are
// defined in their ISA folders; this file only links them in.
#include <cstdlib>
#include <cstring>

#include "core/cpu.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ref/ref.h"

namespace kvant::kernels {

namespace {
KernelTable make_scalar() {
  KernelTable t;
  t.isa = Isa::Scalar;
  t.gemm_bf16 = ref::gemm_bf16;
  t.f32_to_bf16 = ref::f32_to_bf16;
  return t;
}
}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

const KernelTable* table_for(Isa isa) {
  static const KernelTable scalar = make_scalar();
  if (isa == Isa::Scalar) return &scalar;
  return nullptr;  // SIMD tables register below as they are added
}

const KernelTable& active() {
  static const KernelTable* t = [] {
    const char* env = std::getenv("KVANT_ISA");
    Isa order[] = {Isa::Avx512, Isa::Avx2, Isa::Scalar};
    for (Isa isa : order) {
      if (env && *env && std::strcmp(env, isa_name(isa)) != 0) continue;
      if (auto* p = table_for(isa)) return p;
    }
    return table_for(Isa::Scalar);
  }();
  return *t;
}

}  // namespace kvant::kernels
