// AWQ scale search (awq.h). The output error of each candidate is measured
// with the BF16 kernels on the calibration rows: Y = X W^T against
// X (Q(W diag(s)) diag(1/s))^T, both rounded as the model rounds its inputs.
#include "quant/awq.h"

#include <algorithm>
#include <cmath>

#include "core/aligned.h"
#include "core/threads.h"
#include "backend/backend.h"
#include "numerics/bf16.h"
#include "numerics/int4_rtn.h"

namespace kvant {
namespace {

// y[n, rows] = x[n, cols] w[rows, cols]^T on the CPU backend: x rounded to
// BF16 as every product does, BF16 weights, FP32 sums.
void product(backend::Backend& be, const float* x, const uint16_t* w, int64_t n, int64_t rows,
             int64_t cols, float* y) {
  const Matrix m = be.prepare_bf16(w, rows, cols);
  be.linear(backend::dense<const float>(x, n, cols), {&m, nullptr}, backend::dense(y, n, rows));
}

}  // namespace

AwqResult awq_search(const float* w, int64_t rows, int64_t cols, const float* x, int64_t n,
                     const AwqOptions& o) {
  AwqResult best;
  // Mean |x| per input channel.
  std::vector<double> mean_abs(static_cast<size_t>(cols), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < cols; ++c) mean_abs[size_t(c)] += std::fabs(x[i * cols + c]);
  for (auto& m : mean_abs) m = std::max(m / double(std::max<int64_t>(n, 1)), 1e-8);

  const auto be = backend::make_cpu_backend();
  AlignedBuffer<uint16_t> wb(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) wb[i] = f32_to_bf16(w[i]);
  std::vector<float> ref(size_t(n * rows)), out(size_t(n * rows));
  product(*be, x, wb.data(), n, rows, cols, ref.data());

  std::vector<float> ws(size_t(rows * cols)), deq(size_t(rows * cols)), s(static_cast<size_t>(cols));
  double best_mse = -1;
  for (int step = 0; step <= o.grid; ++step) {
    const double alpha = double(step) / o.grid;
    // s = mean_abs^alpha, normalised so that max * min = 1 (keeps s near 1).
    double lo = 1e30, hi = 0;
    for (int64_t c = 0; c < cols; ++c) {
      s[size_t(c)] = float(std::pow(mean_abs[size_t(c)], alpha));
      lo = std::min(lo, double(s[size_t(c)]));
      hi = std::max(hi, double(s[size_t(c)]));
    }
    const double norm = std::sqrt(lo * hi);
    for (auto& v : s) v = float(v / norm);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) ws[size_t(r * cols + c)] = w[r * cols + c] * s[size_t(c)];
    const Int4Weight q = rtn_quantize(ws.data(), rows, cols, o.group, o.asym);
    dequantize(q, deq.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        wb[size_t(r * cols + c)] = f32_to_bf16(deq[size_t(r * cols + c)] / s[size_t(c)]);
    product(*be, x, wb.data(), n, rows, cols, out.data());
    double se = 0;
    for (size_t i = 0; i < out.size(); ++i) se += double(out[i] - ref[i]) * double(out[i] - ref[i]);
    const double mse = se / double(std::max<size_t>(out.size(), 1));
    if (step == 0) best.mse_rtn = mse;
    if (best_mse < 0 || mse < best_mse) {
      best_mse = mse;
      best.alpha = float(alpha);
      best.scale = s;
    }
  }
  best.mse_best = best_mse;
  if (best.alpha == 0.f) std::fill(best.scale.begin(), best.scale.end(), 1.f);
  return best;
}

}  // namespace kvant
