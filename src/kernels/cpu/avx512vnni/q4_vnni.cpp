// AVX-512 VNNI gemm_q4 (Ice Lake, Zen 4, Sapphire Rapids): one VPDPBUSD per
// 64 nibble x int8 products. Reached only when cpuid reports AVX512_VNNI.
#include "kernels/cpu/avx512/q4_avx512_impl.h"
#include "kernels/cpu/avx512vnni/avx512vnni.h"

namespace kvant::kernels::avx512vnni {

void gemm_q4(const Q8Rows& x, const Q4Weights& w, float* y, int64_t ldy, int64_t m, int64_t n0,
             int64_t n1) {
  avx512::gemm_q4_impl<true>(x, w, y, ldy, m, n0, n1);
}

}  // namespace kvant::kernels::avx512vnni
