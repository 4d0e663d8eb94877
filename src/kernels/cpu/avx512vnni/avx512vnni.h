// Entry points of the AVX-512 VNNI kernels (AVX-512 F/BW/VL/DQ + VNNI), for
// dispatch.cpp only; compiled with VNNI flags, run only after cpuid says so.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernels.h"

namespace kvant::kernels::avx512vnni {
void gemm_q4(const Q8Rows& x, const Q4Weights& w, float* y, int64_t ldy, int64_t m, int64_t n0,
             int64_t n1);
}  // namespace kvant::kernels::avx512vnni
