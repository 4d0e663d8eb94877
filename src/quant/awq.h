// Activation-aware scales for INT4 weights (the AWQ idea): input channels
// that carry large activations matter more, so a product's weight columns
// are multiplied by s[c] = mean|x_c|^alpha (normalised) before quantizing
// and the product's input is divided by s[c] (folded into the preceding
// norm or linear by the caller), which leaves the FP product unchanged but
// gives salient columns a finer grid. alpha is searched on calibration
// inputs to minimise the output error of the quantized product. Owns the
// search only: capturing inputs and folding scales are the caller's.
#pragma once

#include <cstdint>
#include <vector>

namespace kvant {

struct AwqOptions {
  int group = 128;
  bool asym = false;
  int grid = 20;  // alpha in {0, 1/grid, ..., 1}
};

struct AwqResult {
  std::vector<float> scale;  // [cols]; all ones when alpha = 0 wins
  float alpha = 0.f;
  double mse_rtn = 0;   // output MSE of plain RTN (alpha = 0)
  double mse_best = 0;  // output MSE with the chosen scales
};

// w: [rows, cols] FP32, the product's weight (fused parts stacked by rows);
// x: [n, cols] FP32 calibration inputs of the product.
AwqResult awq_search(const float* w, int64_t rows, int64_t cols, const float* x, int64_t n,
                     const AwqOptions& o);

}  // namespace kvant
