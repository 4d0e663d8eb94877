// Thin wrappers over the kernel table (matrix products split over output rows
// in blocks of 64, so every thread streams its own slice of the weights) and
// the RoPE rotation, which is too small to need a kernel of its own.
#include "model/ops.h"

#include <algorithm>
#include <cmath>

#include "core/threads.h"
#include "kernels/cpu/kernels.h"
#include "numerics/bf16.h"

namespace kvant::ops {

void matmul(const uint16_t* x, int64_t ldx, const Matrix& W, float* y, int64_t ldy, int64_t m) {
  const auto& K = kernels::active();
  parallel_for(W.rows, 64, [&](int64_t n0, int64_t n1) {
    K.gemm_bf16_packed(x, ldx, W.packed.data(), W.cols, y, ldy, m, n0, n1);
  });
}

void Q8Scratch::ensure(int64_t values) {
  if (values <= capacity) return;
  q = AlignedBuffer<int8_t>(size_t(values));
  s = AlignedBuffer<float>(size_t(values / kernels::kQ4Block + 1));
  sum = AlignedBuffer<int32_t>(size_t(values / kernels::kQ4Block + 1));
  capacity = values;
}

void matmul_q4(const float* x, int64_t ldx, const Q4Matrix& W4, float* y, int64_t ldy, int64_t m,
               Q8Scratch& q8) {
  const auto& K = kernels::active();
  const int64_t k = W4.cols, nb = k / kernels::kQ4Block;
  q8.ensure(m * k);
  parallel_for(m, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      K.quantize_q8(x + r * ldx, k, q8.q.data() + r * k, q8.s.data() + r * nb, q8.sum.data() + r * nb);
  });
  const kernels::Q4Weights w{W4.w.data(), W4.scales.data(), W4.offs.size() ? W4.offs.data() : nullptr,
                             W4.rows, W4.cols, W4.group};
  // Tokens in tiles of 64, so a thread's weight slice and a tile of
  // activations stay in its L2 during prefill.
  constexpr int64_t kTile = 64;
  parallel_for(W4.rows, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t i0 = 0; i0 < m; i0 += kTile) {
      const kernels::Q8Rows xr{q8.q.data() + i0 * k, q8.s.data() + i0 * nb, q8.sum.data() + i0 * nb,
                               k, nb};
      K.gemm_q4(xr, w, y + i0 * ldy, ldy, std::min(kTile, m - i0), n0, n1);
    }
  });
}

void linear(const float* x, int64_t ldx, const Matrix& W, const Q4Matrix& W4, float* y,
            int64_t ldy, int64_t m, uint16_t* xb, Q8Scratch& q8) {
  if (!W4.empty()) return matmul_q4(x, ldx, W4, y, ldy, m, q8);
  to_bf16(x, ldx, xb, W.cols, m, W.cols);
  matmul(xb, W.cols, W, y, ldy, m);
}

Q4Matrix pack_q4(const int8_t* q, const float* scale, const int8_t* zero, int64_t rows,
                 int64_t cols, int64_t group) {
  Q4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.group = group;
  const int64_t panels = kernels::q4_panels(rows);
  m.w = AlignedBuffer<uint8_t>(size_t(panels * cols * 8));
  m.scales = AlignedBuffer<uint16_t>(size_t(panels * kernels::q4_groups(cols, group) * 16));
  if (zero) m.offs = AlignedBuffer<uint8_t>(m.scales.size());
  kernels::pack_q4(q, scale, zero, rows, cols, group, m.w.data(), m.scales.data(),
                   zero ? m.offs.data() : nullptr);
  return m;
}

void to_bf16(const float* x, int64_t ld, uint16_t* xb, int64_t ldb, int64_t rows, int64_t n) {
  const auto& K = kernels::active();
  for (int64_t r = 0; r < rows; ++r) K.f32_to_bf16(x + r * ld, xb + r * ldb, n);
}

void rmsnorm(const float* x, const float* w, float eps, float* out, int64_t n) {
  kernels::active().rmsnorm(x, w, 0.f, eps, out, n);
}

void rope(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t h = hd / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] - b * sin[i];
    x[i + h] = b * cos[i] + a * sin[i];
  }
}

}  // namespace kvant::ops

namespace kvant {

void Matrix::row_f32(int64_t r, float scale, float* out) const {
  // Inverse of the P16-pair packing for one row: element (r, 2q+e) sits at
  // ((panel * kp) + q) * 32 + 2 * (r % 16) + e.
  const int64_t kp = (cols + 1) / 2;
  const uint16_t* base = packed.data() + (r / kernels::kPackRows) * kp * 32 + 2 * (r % kernels::kPackRows);
  for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(base[(c / 2) * 32 + (c & 1)]) * scale;
}

}  // namespace kvant
