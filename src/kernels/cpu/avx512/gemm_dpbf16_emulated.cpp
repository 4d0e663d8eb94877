// The AVX512_BF16 GEMM (avx512bf16/gemm_avx512bf16.cpp) rebuilt with
// VDPBF16PS emulated by two FMAs, as kvant::kernels::avx512bf16_emulated.
// It lives here because it needs only this folder's AVX-512 F/BW/VL/DQ
// flags; it exists so tests can exercise that kernel's tiling, packing and
// tails on CPUs without AVX512_BF16. Not used by dispatch.
#define KVANT_EMULATE_DPBF16 1
#include "kernels/cpu/avx512bf16/gemm_avx512bf16.cpp"
