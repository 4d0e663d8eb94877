// Scalar reference kernels (see kernels.h for the contracts).
#pragma once

#include <cstdint>

namespace kvant::kernels::ref {
void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y,
               int64_t ldy, int64_t m, int64_t n0, int64_t n1);
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
}  // namespace kvant::kernels::ref
