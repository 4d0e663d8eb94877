// Group-wise round-to-nearest (RTN) INT4 quantization of a [rows, cols]
// weight, its inverse, and error statistics. Rules (docs/FORMATS.md, "INT4
// weights"), per group of `group` consecutive columns of one row:
//  - Symmetric: m = the element of largest |value|, signed (the first such
//    in column order). d0 = m / -8, stored as d = bf16(d0); q = clamp(
//    floor(w / d0 + 1/2), -8, 7) (ties up, as llama.cpp's Q4_0), dividing by
//    the unrounded d0; d0 == 0 gives q = 0. m itself maps to exactly -8, so
//    the full [-8, 7] range is used with the sign of d chosen per group.
//    Why ties up and d0: checkpoints that were 4-bit before (GGUF Q4_K, Q4_1)
//    put many w / d0 exactly on .5; half-to-even rounding of those measured
//    worse (Gemma 3 270M, WikiText-2 KL vs BF16 0.50 against 0.39 with ties
//    up; SmolLM2 unchanged). Elements not clipped are within |d0|/2 of
//    their value, plus |q| |d - d0| <= 8 * 2^-9 |d0| for storing d; only
//    elements of m's opposite sign with |w| > 7.5 |d0| clip to 7 (e.g. +1
//    beside -1 reads back as about 0.875). So |w - w'| < 1.032 |d| always.
//  - Asymmetric: lo = min(min, 0), hi = max(max, 0) (zero stays exact, as
//    compressed-tensors' minmax observer does); s = bf16((hi - lo) / 15);
//    zero = clamp(round(-lo / s) - 8, -8, 7); q = clamp(round(w / s) + zero,
//    -8, 7); s == 0 gives q = zero = 0. Error <= 0.6 s: s/2 from rounding,
//    plus at most a few hundredths of a step where the BF16-rounded s makes
//    round(hi/s) + round(-lo/s) reach 16 and hi clips to 7.
// round() in the asymmetric rule is round-half-to-even, as torch.round. Owns the arithmetic only:
// no file layout (io/compressed_tensors.h), no choice of which tensors to
// quantize (quant/checkpoint.h). Below the model, so that the loader can
// quantize at load.
#pragma once

#include <cstdint>

#include "numerics/int4.h"

namespace kvant {

// One group's parameters under the rules above, and one value's code under
// them: rtn_quantize is these two per group; GPTQ (quant/gptq.h) takes the
// parameters of a group once and then rounds its columns one at a time.
struct Int4GroupParams {
  float scale = 0;  // stored (BF16-representable)
  float div = 0;    // w / div is rounded: d0 (symmetric) or the scale
  int8_t zero = 0;  // 0 when symmetric
};
Int4GroupParams int4_group_params(const float* w, int n, bool asym);
int8_t int4_code(float w, const Int4GroupParams& p, bool asym);

// The same rules with the group's range shrunk by the factor f in
// {1 - (1 - min_ratio) s / steps : s = 0 .. steps} (1 down to min_ratio)
// that minimises sum_i h_i (w_i - w'_i)^2 (h: per-element
// weights, e.g. the diagonal of an input Hessian; nullptr weighs all
// alike); f = 1 is tried first and kept on ties, so the result is never worse
// than int4_group_params under that measure. Shrinking clips the group's
// largest values to give the others a finer grid (the "MSE observer" of GPTQ
// tool chains, the clip search of AWQ).
Int4GroupParams int4_group_params_clipped(const float* w, const float* h, int n, bool asym,
                                          float min_ratio = 0.7f, int steps = 40);

// `w` is row-major [rows, cols]; when group does not divide cols the last
// group of each row is short (ceil(cols / group) scales per row).
// Rows are split over the OpenMP threads.
Int4Weight rtn_quantize(const float* w, int64_t rows, int64_t cols, int group, bool asym);

// The same with every group's parameters from int4_group_params_clipped,
// element c of a row weighted by h[c] (h: [cols], e.g. the mean square of
// the product's input column; nullptr weighs all alike).
Int4Weight rtn_quantize_clipped(const float* w, int64_t rows, int64_t cols, int group, bool asym,
                                const float* h);

// out: [rows, cols], w[r, c] = (q - zero) * scale.
void dequantize(const Int4Weight& w, float* out);

struct QuantError {
  double rms = 0;      // sqrt(mean((a - b)^2))
  double rel_rms = 0;  // rms / sqrt(mean(a^2)); 0 when a is all zeros and b equals it
  double max_abs = 0;
};
QuantError quant_error(const float* ref, const float* approx, int64_t n);

}  // namespace kvant
