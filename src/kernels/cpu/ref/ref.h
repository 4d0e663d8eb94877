// Scalar reference kernels (see kernels.h for the contracts): the oracle every
// SIMD kernel is tested against, and the Scalar table. Written for clarity,
// not speed; transcendental functions and long sums use double where that
// makes the oracle more accurate than the kernels it checks.
#pragma once

#include <cstdint>

#include "kernels/cpu/kernels.h"

namespace kvant::kernels::ref {
void gemm_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y, int64_t ldy,
               int64_t m, int64_t n0, int64_t n1);
void gemm_bf16_packed(const uint16_t* x, int64_t ldx, const uint16_t* wp, int64_t k, float* y,
                      int64_t ldy, int64_t m, int64_t n0, int64_t n1);
void pack_bf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* wp);
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n);
void rmsnorm(const float* x, const float* w, float w_offset, float eps, float* y, int64_t n);
void silu_mul(const float* gate, const float* up, float* out, int64_t n);
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);
void softmax(float* x, int64_t n);
int64_t argmax(const float* x, int64_t n);
void attn_scores(const float* q, const uint16_t* k, int64_t ldk, int64_t n, int64_t head_dim,
                 float scale, float* scores);
void attn_weighted_sum(const float* p, const uint16_t* v, int64_t ldv, int64_t n, int64_t head_dim,
                       float* out);
void paged_attn_decode(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* scratch, float* out);
void paged_attn_scores(const float* q, int64_t group, int64_t head_dim, float scale,
                       const PagedKv& kv, float* s, int64_t lds);
void paged_attn_probs(float* s, int64_t lds, int64_t group, const PagedKv& kv);
void paged_attn_wsum(const float* p, int64_t lds, int64_t group, int64_t head_dim,
                     const PagedKv& kv, int64_t d0, int64_t d1, float* out);
float peak_probe(int64_t iters);
void quantize_q8(const float* x, int64_t k, int8_t* q, float* s, int32_t* sum);
void gemm_q4(const Q8Rows& x, const Q4Weights& w, float* y, int64_t ldy, int64_t m, int64_t n0,
             int64_t n1);
void gemm_f8(const uint16_t* x, int64_t ldx, const F8Weights& w, float* y, int64_t ldy, int64_t m,
             int64_t n0, int64_t n1);
inline constexpr int64_t kPeakFlopsPerIter = 16;
}  // namespace kvant::kernels::ref
