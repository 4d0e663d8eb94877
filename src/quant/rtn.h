// Group-wise round-to-nearest (RTN) INT4 quantization of a [rows, cols]
// weight, its inverse, and error statistics. Rules (docs/FORMATS.md, "INT4
// weights"), per group of `group` consecutive columns of one row:
//  - Symmetric: m = the element of largest |value|, signed (the first such
//    in column order). d = bf16(m / -8); q = clamp(round(w / d), -8, 7),
//    dividing by the BF16-rounded d; d == 0 gives q = 0. m itself maps to -8
//    (|m/d| is within 2^-8 relative of 8), so the full [-8, 7] range is used with the
//    sign of d chosen per group. Elements not clipped are within |d|/2 of
//    their value; only elements of m's opposite sign with |w| > 7.5 |d| clip
//    to 7 (e.g. +1 beside -1 reads back as 0.875), an error below 1.032 |d|
//    (|w/d| <= |m/d| <= 8 / (1 - 2^-8)). So |w - w'| < 1.032 |d| always.
//  - Asymmetric: lo = min(min, 0), hi = max(max, 0) (zero stays exact, as
//    compressed-tensors' minmax observer does); s = bf16((hi - lo) / 15);
//    zero = clamp(round(-lo / s) - 8, -8, 7); q = clamp(round(w / s) + zero,
//    -8, 7); s == 0 gives q = zero = 0. Error <= 0.6 s: s/2 from rounding,
//    plus at most a few hundredths of a step where the BF16-rounded s makes
//    round(hi/s) + round(-lo/s) reach 16 and hi clips to 7.
// round() is round-half-to-even, as torch.round. Owns the arithmetic only:
// no file layout (io/compressed_tensors.h), no choice of which tensors to
// quantize (quant/checkpoint.h).
#pragma once

#include <cstdint>

#include "io/compressed_tensors.h"

namespace kvant {

// `w` is row-major [rows, cols]; when group does not divide cols the last
// group of each row is short (ceil(cols / group) scales per row).
// Rows are split over the OpenMP threads.
Int4Weight rtn_quantize(const float* w, int64_t rows, int64_t cols, int group, bool asym);

// out: [rows, cols], w[r, c] = (q - zero) * scale.
void dequantize(const Int4Weight& w, float* out);

struct QuantError {
  double rms = 0;      // sqrt(mean((a - b)^2))
  double rel_rms = 0;  // rms / sqrt(mean(a^2)); 0 when a is all zeros and b equals it
  double max_abs = 0;
};
QuantError quant_error(const float* ref, const float* approx, int64_t n);

}  // namespace kvant
