// gemm_f8 with VDPBF16PS and VPERMI2B (gemm_f8_dpbf16.h); the Avx512Bf16
// table takes it where the CPU has AVX512_VBMI (this file is built with it).
#include "kernels/cpu/avx512bf16/avx512bf16.h"
#include "kernels/cpu/avx512bf16/gemm_f8_dpbf16.h"

namespace kvant::kernels::avx512bf16 {

void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1) {
  avx512bf16_f8::gemm_f8_dpbf16<false>(x, ldx, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx512bf16
