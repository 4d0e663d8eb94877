// Calibration capture and scale folding for AWQ (awq_plan.h).
#include "quant/awq_plan.h"

#include <algorithm>
#include <cstdio>

#include "model/archs/arch.h"
#include "model/archs/tensor_names.h"
#include "quant/calibration.h"

namespace kvant {

void AwqPlan::apply(const std::string& name, const std::vector<int64_t>& shape,
                    std::vector<float>& v) const {
  if (auto it = col_mul.find(name); it != col_mul.end() && shape.size() == 2) {
    const auto& s = it->second;
    const int64_t cols = shape[1];
    for (size_t i = 0; i < v.size(); ++i) v[i] *= s[i % size_t(cols)];
  }
  if (auto it = row_div.find(name); it != row_div.end() && shape.size() == 2) {
    const auto& s = it->second;
    const int64_t cols = shape[1];
    for (size_t i = 0; i < v.size(); ++i) v[i] /= s[i / size_t(cols)];
  }
  if (auto it = norm_div.find(name); it != norm_div.end()) {
    const auto& s = it->second;
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = norm_plus_one ? (1.f + v[i]) / s[i] - 1.f : v[i] / s[i];
  }
}

Result<AwqPlan> awq_plan(Model& model, std::span<const int32_t> tokens, int64_t chunk,
                         int64_t sample_rows, const AwqOptions& o) {
  const ModelConfig& c = model.config();
  const int64_t ch = std::max<int64_t>(1, std::min<int64_t>(chunk, c.max_positions));
  const int64_t total = int64_t(tokens.size()) / ch * ch;  // the rows run_calibration feeds
  const int64_t stride = std::max<int64_t>(1, total / sample_rows);
  // Captured rows per (layer, product): 0 q|k|v (hidden), 2 gate|up (hidden), 3 down (ffn).
  std::vector<std::vector<float>> cap(size_t(c.layers * 4));
  int64_t row_base = 0;  // index of the chunk's first token among all calibration tokens
  auto observe = [&](int64_t l, int which, const float* x, int64_t ldx, int64_t rows) {
    if (which == 1) return;
    const int64_t cols = which == 3 ? c.ffn : c.hidden;
    auto& dst = cap[size_t(l * 4 + which)];
    for (int64_t r = 0; r < rows; ++r)
      if ((row_base + r) % stride == 0 && int64_t(dst.size()) / cols < sample_rows)
        dst.insert(dst.end(), x + r * ldx, x + r * ldx + cols);
  };
  auto seen = run_calibration(model, tokens, chunk, "awq", observe,
                              [&](int64_t k, int64_t n) { row_base = k * n; });
  if (!seen) return seen.error();

  AwqPlan plan;
  plan.norm_plus_one = c.arch->hf_norm_plus_one;
  const ModelWeights& W = model.weights();
  auto matrix_f32 = [](const Matrix& m) {
    std::vector<float> v(size_t(m.rows * m.cols));
    for (int64_t r = 0; r < m.rows; ++r) m.row_f32(r, 1.f, v.data() + r * m.cols);
    return v;
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    const LayerWeights& L = W.layers[size_t(l)];
    if (!L.experts.empty())
      return make_error("awq: layer " + std::to_string(l) +
                        " is a mixture-of-experts layer; activation-aware scales cover dense MLPs "
                        "only so far (use --method rtn)");
    if (L.wqkv.rows == 0 || L.w_gate_up.rows == 0 || L.w_down.rows == 0)
      return make_error("awq: the calibration model must hold BF16 weights");
    auto hf = [&](const char* role) {
      return archs::layer_tensor(archs::Naming::Hf, *c.arch, l, role);
    };
    struct Site {
      int which;
      const Matrix* m;
      const char* label;
    };
    for (const Site& st : {Site{0, &L.wqkv, "q|k|v"}, Site{2, &L.w_gate_up, "gate|up"},
                           Site{3, &L.w_down, "down"}}) {
      const auto& x = cap[size_t(l * 4 + st.which)];
      const int64_t cols = st.m->cols, n = int64_t(x.size()) / cols;
      const auto w = matrix_f32(*st.m);
      const AwqResult r = awq_search(w.data(), st.m->rows, cols, x.data(), n, o);
      char line[160];
      std::snprintf(line, sizeof line, "layer %2lld %-7s alpha %.2f  output MSE %.3g -> %.3g (%.1f%%)",
                    (long long)l, st.label, r.alpha, r.mse_rtn, r.mse_best,
                    r.mse_rtn > 0 ? 100.0 * r.mse_best / r.mse_rtn : 100.0);
      plan.report.push_back(line);
      std::vector<float> energy(static_cast<size_t>(cols), 0.f);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < cols; ++i) energy[size_t(i)] += x[size_t(t * cols + i)] * x[size_t(t * cols + i)];
      for (int64_t i = 0; i < cols; ++i)
        energy[size_t(i)] /= float(std::max<int64_t>(n, 1)) * r.scale[size_t(i)] * r.scale[size_t(i)];
      const std::vector<const char*> names =
          st.which == 0 ? std::vector<const char*>{"wq", "wk", "wv"}
          : st.which == 2 ? std::vector<const char*>{"w_gate", "w_up"}
                          : std::vector<const char*>{"w_down"};
      for (const char* t : names) plan.col_energy[hf(t)] = energy;
      if (r.alpha == 0.f) continue;
      if (st.which == 0) {
        for (const char* t : {"wq", "wk", "wv"}) plan.col_mul[hf(t)] = r.scale;
        plan.norm_div[hf("attn_norm")] = r.scale;
      } else if (st.which == 2) {
        plan.col_mul[hf("w_gate")] = r.scale;
        plan.col_mul[hf("w_up")] = r.scale;
        plan.norm_div[hf("ffn_norm")] = r.scale;
      } else {
        plan.col_mul[hf("w_down")] = r.scale;
        plan.row_div[hf("w_up")] = r.scale;
      }
    }
  }
  return plan;
}

}  // namespace kvant
