// Entry points of the AVX512_BF16 GEMM (VDPBF16PS), for dispatch.cpp only.
// The Avx512Bf16 table takes every other entry from avx512/.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernels.h"

namespace kvant::kernels::avx512bf16 {
void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy,
               int64_t m, int64_t n0, int64_t n1);
void gemm_bf16_packed(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                      int64_t ldy, int64_t m, int64_t n0, int64_t n1);
float peak_probe(int64_t iters);
// FP8 weights (gemm_f8_dpbf16.h); needs AVX512_VBMI besides AVX512_BF16.
void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1);
inline constexpr int64_t kPeakFlopsPerIter = 24 * 32 * 2;  // 24 chains x 16 lanes x 2 pairs
}  // namespace kvant::kernels::avx512bf16

// The same kernels with VDPBF16PS emulated by two FMAs (built from the same
// source by avx512/gemm_dpbf16_emulated.cpp). Needs only AVX-512 F/BW/VL/DQ;
// for tests, so the BF16 kernel's tiling is checked on machines without it.
namespace kvant::kernels::avx512bf16_emulated {
void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy,
               int64_t m, int64_t n0, int64_t n1);
void gemm_bf16_packed(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                      int64_t ldy, int64_t m, int64_t n0, int64_t n1);
// Needs AVX512_VBMI.
void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1);
}  // namespace kvant::kernels::avx512bf16_emulated
