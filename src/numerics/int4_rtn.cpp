// The scale is rounded to BF16 before q is chosen, so q is the best integer
// for the scale that is actually stored, not for the exact one.
#include "numerics/int4_rtn.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/threads.h"
#include "numerics/bf16.h"

namespace kvant {
namespace {

inline float to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
inline int clamp4(float x) { return int(std::clamp(x, -8.f, 7.f)); }

}  // namespace

Int4GroupParams int4_group_params(const float* w, int n, bool asym) {
  Int4GroupParams p;
  if (!asym) {
    float m = 0;
    for (int i = 0; i < n; ++i)
      if (std::fabs(w[i]) > std::fabs(m)) m = w[i];
    p.div = m / -8.f;
    p.scale = to_bf16(p.div);
    return p;
  }
  float lo = 0, hi = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  p.scale = p.div = to_bf16((hi - lo) / 15.f);
  if (p.scale != 0.f) p.zero = int8_t(clamp4(std::nearbyint(-lo / p.scale) - 8.f));
  return p;
}

Int4GroupParams int4_group_params_clipped(const float* w, const float* h, int n, bool asym,
                                          float min_ratio, int steps) {
  const Int4GroupParams full = int4_group_params(w, n, asym);
  if (full.scale == 0.f || steps <= 0) return full;
  auto err = [&](const Int4GroupParams& p) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const double d = double(w[i]) - double(int4_code(w[i], p, asym) - p.zero) * p.scale;
      e += (h ? double(h[i]) : 1.0) * d * d;
    }
    return e;
  };
  Int4GroupParams best = full;
  double best_err = err(full);
  float lo = 0, hi = 0;
  for (int i = 0; i < n && asym; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
  for (int s = 1; s <= steps; ++s) {
    const float f = 1.f - (1.f - min_ratio) * float(s) / float(steps);
    Int4GroupParams p;
    if (!asym) {
      p.div = full.div * f;
      p.scale = to_bf16(p.div);
    } else {
      const float l = lo * f, u = hi * f;
      p.scale = p.div = to_bf16((u - l) / 15.f);
      if (p.scale == 0.f) continue;
      p.zero = int8_t(clamp4(std::nearbyint(-l / p.scale) - 8.f));
    }
    const double e = err(p);
    if (e < best_err) best = p, best_err = e;
  }
  return best;
}

int8_t int4_code(float w, const Int4GroupParams& p, bool asym) {
  if (p.scale == 0.f) return asym ? p.zero : 0;
  if (!asym) return int8_t(clamp4(std::floor(w / p.div + 0.5f)));
  return int8_t(clamp4(std::nearbyint(w / p.div) + float(p.zero)));
}

namespace {

// rtn_quantize with group parameters from params(values, column, n).
template <class Params>
Int4Weight rtn_with(const float* w, int64_t rows, int64_t cols, int group, bool asym,
                    Params&& params) {
  KV_CHECK(group > 0);
  Int4Weight r;
  r.rows = rows;
  r.cols = cols;
  r.group = group;
  // A short last group where group does not divide cols (compressed-tensors
  // stores ceil(cols / group) scales per row).
  const int64_t groups = (cols + group - 1) / group;
  r.q.resize(size_t(rows * cols));
  r.scale.resize(size_t(rows * groups));
  if (asym) r.zero.resize(size_t(rows * groups));
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(cols, 1));
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row)
      for (int64_t g = 0; g < groups; ++g) {
        const size_t off = size_t(row * cols + g * group), gi = size_t(row * groups + g);
        const int n = int(std::min<int64_t>(group, cols - g * group));
        const Int4GroupParams p = params(w + off, g * group, n);
        r.scale[gi] = p.scale;
        if (asym) r.zero[gi] = p.zero;
        for (int i = 0; i < n; ++i) r.q[off + size_t(i)] = int4_code(w[off + size_t(i)], p, asym);
      }
  });
  return r;
}

}  // namespace

Int4Weight rtn_quantize(const float* w, int64_t rows, int64_t cols, int group, bool asym) {
  return rtn_with(w, rows, cols, group, asym,
                  [&](const float* v, int64_t, int n) { return int4_group_params(v, n, asym); });
}

Int4Weight rtn_quantize_clipped(const float* w, int64_t rows, int64_t cols, int group, bool asym,
                                const float* h) {
  return rtn_with(w, rows, cols, group, asym, [&](const float* v, int64_t c0, int n) {
    return int4_group_params_clipped(v, h ? h + c0 : nullptr, n, asym);
  });
}

void dequantize(const Int4Weight& w, float* out) {
  const int64_t groups = (w.cols + w.group - 1) / w.group;
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) {
      const size_t gi = size_t(r * groups + c / w.group);
      const int z = w.zero.empty() ? 0 : w.zero[gi];
      out[r * w.cols + c] = float(w.q[size_t(r * w.cols + c)] - z) * w.scale[gi];
    }
}

QuantError quant_error(const float* ref, const float* approx, int64_t n) {
  QuantError e;
  double se = 0, sr = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(ref[i]) - double(approx[i]);
    se += d * d;
    sr += double(ref[i]) * ref[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  if (n > 0) {
    e.rms = std::sqrt(se / double(n));
    const double rr = std::sqrt(sr / double(n));
    e.rel_rms = rr > 0 ? e.rms / rr : (e.rms > 0 ? INFINITY : 0);
  }
  return e;
}

}  // namespace kvant
