// Hessian capture and per-tensor GPTQ (gptq_plan.h).
#include "quant/gptq_plan.h"

#include <algorithm>
#include <cstdio>

#include "core/aligned.h"
#include "kernels/cpu/kernels.h"
#include "model/archs/arch.h"
#include "model/archs/tensor_names.h"
#include "numerics/bf16.h"
#include "quant/calibration.h"

namespace kvant {

Result<GptqPlan> gptq_plan(Model& model, std::span<const int32_t> tokens, int64_t chunk,
                           const GptqOptions& o) {
  const ModelConfig& c = model.config();
  for (int64_t l = 0; l < c.layers; ++l)
    if (!model.weights().layers[size_t(l)].experts.empty() || c.mla())
      return make_error("gptq: layer " + std::to_string(l) +
                        " is not a dense attention + MLP layer; GPTQ covers dense models so far "
                        "(use --method rtn)");
  GptqPlan plan;
  plan.opts = o;
  const int64_t width[4] = {c.hidden, c.q_dim(), c.hidden, c.ffn};
  std::vector<std::vector<float>> acc(size_t(c.layers * 4));
  for (int64_t l = 0; l < c.layers; ++l)
    for (int w = 0; w < 4; ++w) acc[size_t(l * 4 + w)].assign(size_t(width[w] * width[w]), 0.f);
  const auto& K = kernels::active();
  AlignedBuffer<uint16_t> xt;
  AlignedBuffer<float> tmp;
  // X^T X of each chunk's rows (BF16 inputs: exact products, FP32 sums),
  // added into the layer's accumulator.
  auto observe = [&](int64_t l, int which, const float* x, int64_t ldx, int64_t rows) {
    const int64_t d = width[which];
    if (int64_t(xt.size()) < d * rows) xt = AlignedBuffer<uint16_t>(size_t(d * rows));
    if (int64_t(tmp.size()) < d * d) tmp = AlignedBuffer<float>(size_t(d * d));
    std::vector<uint16_t> row(static_cast<size_t>(d));
    for (int64_t r = 0; r < rows; ++r) {
      K.f32_to_bf16(x + r * ldx, row.data(), d);
      for (int64_t i = 0; i < d; ++i) xt[size_t(i * rows + r)] = row[size_t(i)];
    }
    K.gemm_bf16(xt.data(), rows, xt.data(), rows, tmp.data(), d, d, 0, d);
    auto& a = acc[size_t(l * 4 + which)];
    for (int64_t i = 0; i < d * d; ++i) a[size_t(i)] += tmp[size_t(i)];
    // Each chunk starts at position 0: its first row is the attention sink,
    // counted sink_weight times in all (the extra w - 1 of its outer product).
    if (o.sink_weight != 1.0 && rows > 0) {
      const float extra = float(o.sink_weight - 1.0);
      for (int64_t i = 0; i < d; ++i) {
        const float xi = bf16_to_f32(xt[size_t(i * rows)]) * extra;
        for (int64_t j = 0; j < d; ++j) a[size_t(i * d + j)] += xi * bf16_to_f32(xt[size_t(j * rows)]);
      }
    }
  };
  auto seen = run_calibration(model, tokens, chunk, "gptq", observe);
  if (!seen) return seen.error();
  plan.rows_seen = *seen;
  plan.hessian.resize(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    plan.hessian[i].assign(acc[i].begin(), acc[i].end());
    std::vector<float>().swap(acc[i]);
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    auto hf = [&](const char* role) { return archs::layer_tensor(archs::Naming::Hf, *c.arch, l, role); };
    for (const char* r : {"wq", "wk", "wv"}) plan.tensor[hf(r)] = l * 4 + 0;
    plan.tensor[hf("wo")] = l * 4 + 1;
    plan.tensor[hf("w_gate")] = l * 4 + 2;
    plan.tensor[hf("w_up")] = l * 4 + 2;
    plan.tensor[hf("w_down")] = l * 4 + 3;
  }
  return plan;
}

Result<std::optional<Int4Weight>> GptqPlan::quantize(const std::string& name,
                                                     const std::vector<int64_t>& shape,
                                                     const std::vector<float>& values) {
  auto it = tensor.find(name);
  if (it == tensor.end() || shape.size() != 2) return std::optional<Int4Weight>();
  const std::vector<double>& H0 = hessian[size_t(it->second)];
  const int64_t cols = shape[1];
  if (int64_t(H0.size()) != cols * cols)
    return make_error("gptq: " + name + ": " + std::to_string(cols) +
                      " columns do not match its product's input width");
  const std::vector<double>* H = &H0;
  std::vector<double> scaled;
  if (col_mul) {
    if (auto s = col_mul->find(name); s != col_mul->end()) {
      scaled = H0;
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t j = 0; j < cols; ++j)
          scaled[size_t(i * cols + j)] /= double(s->second[size_t(i)]) * s->second[size_t(j)];
      H = &scaled;
    }
  }
  GptqStats st;
  auto q = gptq_quantize(values.data(), shape[0], cols, *H, opts, &st);
  if (!q) return make_error(name + ": " + q.error().message);
  char line[200];
  std::snprintf(line, sizeof line, "%-45s output error %.4g -> %.4g (%.1f%% of RTN)", name.c_str(),
                st.err_rtn, st.err_gptq, st.err_rtn > 0 ? 100.0 * st.err_gptq / st.err_rtn : 100.0);
  report.push_back(line);
  return std::optional<Int4Weight>(std::move(*q));
}

}  // namespace kvant
