// RoPE: the inverse frequencies of each scaling rule, and the step's cos/sin
// tables (global layers, and sliding layers' own base).
#include <algorithm>
#include <cmath>

#include "model/blocks/blocks.h"
#include "model/model_impl.h"

namespace kvant {

std::vector<float> rope_inv_freq(const RopeConfig& r, int64_t hd, const std::vector<float>& factors) {
  std::vector<float> f(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) {
    // As transformers computes it: base ** (2i/d) in FP32, then 1/x.
    float e = float(2 * i) / float(hd);
    f[size_t(i)] = 1.f / float(std::pow(double(r.theta), double(e)));
  }
  if (!factors.empty())
    for (int64_t i = 0; i < hd / 2; ++i) f[size_t(i)] /= factors[size_t(i)];
  if (r.scaling == RopeScaling::Yarn) {
    // As transformers' YaRN: a linear ramp over the dimensions between the
    // correction range blends interpolated (f / factor) and extrapolated (f)
    // frequencies.
    const double base = double(r.theta), dim = double(hd);
    auto corr = [&](double rot) {
      return dim * std::log(double(r.original_max_positions) / (rot * 2 * M_PI)) / (2 * std::log(base));
    };
    double lo = corr(r.beta_fast), hi = corr(r.beta_slow);
    if (r.truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0);
    hi = std::min(hi, dim - 1);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < hd / 2; ++i) {
      const float ramp = std::clamp(float((double(i) - lo) / (hi - lo)), 0.f, 1.f);
      const float extra = 1.f - ramp;
      const float fe = f[size_t(i)], fi = fe / r.factor;
      f[size_t(i)] = fi * (1.f - extra) + fe * extra;
    }
  } else if (r.scaling == RopeScaling::Linear) {
    for (auto& x : f) x /= r.factor;
  } else if (r.scaling == RopeScaling::Llama3) {
    const double old_ctx = double(r.original_max_positions);
    const double low_wl = old_ctx / r.low_freq_factor, high_wl = old_ctx / r.high_freq_factor;
    for (auto& x : f) {
      const double wl = 2.0 * M_PI / x;
      if (wl < high_wl) continue;
      if (wl > low_wl) {
        x = float(x / r.factor);
        continue;
      }
      const double s =
          (old_ctx / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      x = float((1.0 - s) * x / r.factor + s * x);
    }
  }
  return f;
}

// Rows keep the head_dim/2 stride whatever the rotated width.
void Model::rope_tables() {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t T = plan_.n_tokens(), h = c.head_dim / 2, n = c.rope_dim() / 2;
  auto table = [&](backend::Buffer<float>& b) { return backend::F32{b.data(), T, h, h}; };
  be_->rope_table(plan_, inv_freq_.data(), n, c.rope.attn_factor, table(ws.cos_g), table(ws.sin_g));
  be_->rope_table(plan_, inv_freq_local_.data(), n, c.rope_local.attn_factor, table(ws.cos_l),
                  table(ws.sin_l));
}

}  // namespace kvant
