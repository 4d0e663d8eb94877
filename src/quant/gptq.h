// GPTQ for one INT4 weight: quantizes [rows, cols] column by column in the
// order of the input's Hessian H = sum over calibration rows of x x^T
// (cols x cols), pushing each column's rounding error onto the columns not
// yet quantized through the upper Cholesky factor U of H^-1 (the error
// compensation of Frantar et al., "GPTQ", 2022):
//   err = (w[i] - deq(q[i])) / U[i][i];  w[j] -= err * U[i][j] for j > i
// Before that: columns that never see an input (H[i][i] == 0) are zeroed,
// and damp * mean(diag H) is added to the diagonal. Group parameters
// (numerics/int4_rtn.h's rules: the same scales, zero points and rounding
// as RTN) are taken from a group's current, error-updated values when its
// first column is reached; with act_order, columns go in order of
// decreasing H[i][i] and every group's parameters are taken from the
// original weights first ("static" groups, so groups stay contiguous and
// the checkpoint needs no group index). Rows are independent and split over
// threads. Below the checkpoint writer (quant/checkpoint.h), above
// numerics/; the Hessians come from quant/gptq_plan.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "numerics/int4.h"

namespace kvant {

struct GptqOptions {
  int group = 128;
  bool asym = false;
  double damp = 0.01;  // of the mean of H's diagonal
  bool act_order = false;
  // Weight of each calibration chunk's first position in the Hessian (1: as
  // every other row). That position is the attention sink, where small
  // models carry their massive activations; weighting it protects the
  // outputs every later position attends to (docs/BENCHMARKS.md, GPTQ).
  double sink_weight = 1.0;
  // Group ranges by int4_group_params_clipped (numerics/int4_rtn.h), the
  // error weighted by H's diagonal, instead of the plain min/max rule.
  bool clip = false;
};

struct GptqStats {
  // tr((W - W') H (W - W')^T) / rows, the output error on the calibration
  // rows (up to H's scale), for RTN and for GPTQ.
  double err_rtn = 0, err_gptq = 0;
};

// H: cols x cols, row-major, symmetric positive semi-definite. Errors: a
// Hessian that stays singular after dampening (its Cholesky fails).
Result<Int4Weight> gptq_quantize(const float* w, int64_t rows, int64_t cols,
                                 const std::vector<double>& H, const GptqOptions& o,
                                 GptqStats* stats = nullptr);

}  // namespace kvant
