// CPU kernel table: one entry per kernel, filled once at start-up with the best
// ISA the machine has (AVX-512 with BF16/VNNI, AVX2+FMA, or scalar). Kernels are
// pure functions over raw spans: no allocation, no logging, no threads of their
// own (callers split work, see core/threads.h). Every entry has a scalar
// reference in ref/ and a test against it for each compiled ISA.
#pragma once

#include <cstdint>

namespace kvant::kernels {

enum class Isa { Scalar, Avx2, Avx512 };
const char* isa_name(Isa isa);

struct KernelTable {
  Isa isa = Isa::Scalar;

  // y[i, j] = sum_k x[i, k] * w[j, k] for i in [0, m), j in [n0, n1).
  // x: BF16 activations, row stride ldx; w: BF16 weights [n, k] row-major;
  // y: FP32, row stride ldy. Any k > 0. Accumulates in FP32. The reduction
  // order for one (i, j) does not depend on m, n0 or n1 (batch invariance).
  void (*gemm_bf16)(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y,
                    int64_t ldy, int64_t m, int64_t n0, int64_t n1) = nullptr;

  // dst[i] = bf16(src[i]), round to nearest even.
  void (*f32_to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
};

// The table for this machine; KVANT_ISA=scalar|avx2|avx512 narrows the choice.
const KernelTable& active();
// The table for one ISA, or nullptr when this CPU cannot run it (for tests).
const KernelTable* table_for(Isa isa);

}  // namespace kvant::kernels
