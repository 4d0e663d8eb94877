// Prepared linear weights: the form a backend computes with, made from the
// logical weights a loader reads (BF16 rows, or INT4 values with group scales)
// by Backend::prepare_bf16 / prepare_int4 / prepare_fp8. The model holds them and hands
// them back to the same backend's linear(); it never reads their bytes.
// The CPU forms below are the kernels' packed layouts (kernels/cpu/kernels.h);
// a backend that computes elsewhere keeps its own form behind the same
// fields' sizes (bytes()).
#pragma once

#include <cstdint>

#include "core/aligned.h"

namespace kvant {

// INT4 products take input sizes and group sizes that are multiples of this
// (the kernels' activation block); others stay BF16.
inline constexpr int64_t kInt4Block = 32;

// A linear layer's BF16 weight [rows = out, cols = in], in the "P16 pairs"
// layout (the VDPBF16PS operand order) so every product reads it without
// repacking. A row can be read back (embeddings, export).
struct Matrix {
  AlignedBuffer<uint16_t> packed;  // gemm_bf16_packed_size(rows, cols) elements
  int64_t rows = 0;
  int64_t cols = 0;
  bool empty() const { return rows == 0; }
  size_t bytes() const { return packed.size() * 2; }
  // out[c] = float(W[r, c]) * scale (the CPU layout's inverse; see
  // kernels/cpu/kernels.h, "P16 pairs").
  void row_f32(int64_t r, float scale, float* out) const;
};

// A linear layer's W4A16 weight [rows = out, cols = in] in the "Q4 P16"
// layout: nibbles, BF16 group scales, and zero offsets when the checkpoint is
// asymmetric.
struct Q4Matrix {
  AlignedBuffer<uint8_t> w;
  AlignedBuffer<uint16_t> scales;
  AlignedBuffer<uint8_t> offs;  // empty when symmetric
  int64_t rows = 0, cols = 0, group = 0;
  bool empty() const { return rows == 0; }
  size_t bytes() const { return w.size() + scales.size() * 2 + offs.size(); }
};

// A linear layer's FP8 e4m3 weight [rows = out, cols = in] in the "F8 Q16"
// layout: codes as the checkpoint has them (or quantized at load) and FP32
// scales per row and per group of `group` columns (a 128x128 block scale is
// repeated over its 128 rows; per-channel and per-tensor scales are one
// group of cols). nan_codes: some code is a NaN; subnormal_share: the share
// of codes that are subnormal (kernels::F8Weights).
struct F8Matrix {
  AlignedBuffer<uint8_t> w;
  AlignedBuffer<float> scales;
  int64_t rows = 0, cols = 0, group = 0;
  bool nan_codes = false;
  float subnormal_share = 0.f;
  bool empty() const { return rows == 0; }
  size_t bytes() const { return w.size() + scales.size() * 4; }
};

// A product's low-precision form: INT4 or FP8 (at most one is non-empty).
struct QMatrix {
  Q4Matrix q4;
  F8Matrix f8;
  bool empty() const { return q4.empty() && f8.empty(); }
  size_t bytes() const { return q4.bytes() + f8.bytes(); }
  const char* precision() const { return !q4.empty() ? "int4" : !f8.empty() ? "fp8" : "bf16"; }
};

// A product as a weight set holds it: INT4 or FP8 when q holds that form,
// else BF16. Both may be present (a BF16 copy kept for export); q wins in
// products.
struct LinearRef {
  const Matrix* bf16 = nullptr;
  const QMatrix* q = nullptr;
  bool is_int4() const { return q && !q->q4.empty(); }
  bool is_fp8() const { return q && !q->f8.empty(); }
  int64_t rows() const { return is_int4() ? q->q4.rows : is_fp8() ? q->f8.rows : bf16->rows; }
  int64_t cols() const { return is_int4() ? q->q4.cols : is_fp8() ? q->f8.cols : bf16->cols; }
};

}  // namespace kvant
