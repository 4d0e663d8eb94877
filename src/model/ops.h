// Small elementwise and row operations of the forward pass (norms, RoPE,
// activations, matrix products through the kernel table). Stateless.
#pragma once

#include <cstdint>

#include "core/aligned.h"
#include "model/weights.h"

namespace kvant::ops {

// y[m, W.rows] = x[m, W.cols] (BF16, row stride ldx) @ W^T, split across threads.
void matmul(const uint16_t* x, int64_t ldx, const Matrix& W, float* y, int64_t ldy, int64_t m);
// Scratch for activations quantized to int8 blocks (gemm_q4's input).
struct Q8Scratch {
  AlignedBuffer<int8_t> q;
  AlignedBuffer<float> s;
  AlignedBuffer<int32_t> sum;
  int64_t capacity = 0;  // values
  void ensure(int64_t values);
};
// y[m, W4.rows] = x[m, W4.cols] (FP32, row stride ldx) @ W4^T: the rows are
// quantized into q8 once, then split across threads by output rows.
void matmul_q4(const float* x, int64_t ldx, const Q4Matrix& W4, float* y, int64_t ldy, int64_t m,
               Q8Scratch& q8);
// The product through whichever form the set holds: INT4 when W4 is
// non-empty, else BF16 (x converted into xb, which holds m * W.cols).
void linear(const float* x, int64_t ldx, const Matrix& W, const Q4Matrix& W4, float* y,
            int64_t ldy, int64_t m, uint16_t* xb, Q8Scratch& q8);
// Packs W4A16 values (q [rows, cols] in [-8, 7], scale [rows, cols / group],
// zero likewise or nullptr) into a Q4Matrix.
Q4Matrix pack_q4(const int8_t* q, const float* scale, const int8_t* zero, int64_t rows,
                 int64_t cols, int64_t group);
// Rows of x (FP32, stride ld) -> BF16 rows (stride ldb), n values each.
void to_bf16(const float* x, int64_t ld, uint16_t* xb, int64_t ldb, int64_t rows, int64_t n);
// out = x * rsqrt(mean(x^2) + eps) * w, one row of n.
void rmsnorm(const float* x, const float* w, float eps, float* out, int64_t n);
// Half-split (NeoX) rotation of one head of length hd with cos/sin [hd/2].
void rope(float* x, const float* cos, const float* sin, int64_t hd);

}  // namespace kvant::ops
