// The AVX512_BF16 FP8-weight GEMM (avx512bf16/gemm_f8_avx512bf16.cpp) rebuilt
// with its BF16 instructions emulated, as kvant::kernels::avx512bf16_emulated:
// tests run its tiling on AVX-512 machines without AVX512_BF16. Not used by
// dispatch.
#define KVANT_EMULATE_DPBF16 1
#include "kernels/cpu/avx512bf16/gemm_f8_avx512bf16.cpp"
