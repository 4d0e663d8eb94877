// The VDPBF16PS FP8 GEMM (avx512bf16/gemm_f8_dpbf16.h) with the instruction
// replaced by two FMAs, for tests on CPUs with AVX512_VBMI but no
// AVX512_BF16 (this file alone in avx512/ is built with VBMI; nothing reaches
// it through dispatch).
#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/avx512bf16/gemm_f8_dpbf16.h"

namespace kvant::kernels::avx512bf16_emulated {

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  avx512bf16_f8::gemm_f8_dpbf16<true>(x, ldx, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx512bf16_emulated
