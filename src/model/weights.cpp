// The one walk over a weight set's linear products (weights.h) and the
// reports built on it.
#include "model/weights.h"

namespace kvant {

void for_each_linear(const ModelWeights& w, const std::function<void(const LinearInfo&)>& fn) {
  fn({"embed", &w.embed, nullptr, true});
  if (!w.output.empty() || !w.output_q.empty()) fn({"output", &w.output, &w.output_q, true});
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    auto visit = [&](const std::string& name, const Matrix& m, const QMatrix* q) {
      if (!m.empty() || (q && !q->empty())) fn({p + name, &m, q, false});
    };
    visit("qkv", L.wqkv, &L.wqkv_q);
    visit("o", L.wo, &L.wo_q);
    visit("gate_up", L.w_gate_up, &L.w_gate_up_q);
    visit("down", L.w_down, &L.w_down_q);
    visit("router", L.router, nullptr);
    for (size_t e = 0; e < L.experts.size(); ++e) {
      const std::string x = "experts." + std::to_string(e) + ".";
      visit(x + "gate_up", L.experts[e].gate_up, &L.experts[e].gate_up_q);
      visit(x + "down", L.experts[e].down, &L.experts[e].down_q);
    }
    visit("shared.gate_up", L.shared.gate_up, &L.shared.gate_up_q);
    visit("shared.down", L.shared.down, &L.shared.down_q);
    visit("q_b", L.wq_b, &L.wq_b_q);
    visit("kv_b", L.wkv_b, nullptr);
    for (size_t h = 0; h < L.w_uk_t.size(); ++h) visit("uk_t." + std::to_string(h), L.w_uk_t[h], nullptr);
    for (size_t h = 0; h < L.w_uv.size(); ++h) visit("uv." + std::to_string(h), L.w_uv[h], nullptr);
    visit("indexer.q_b", L.idx_wq_b, nullptr);
  }
  for (size_t k = 0; k < w.mtp.size(); ++k)
    fn({"mtp." + std::to_string(k) + ".eh_proj", &w.mtp[k].eh_proj, nullptr, false});
}

std::string weights_precision(const ModelWeights& w) {
  int64_t q4 = 0, f8 = 0, total = 0;
  for_each_linear(w, [&](const LinearInfo& i) {
    if (i.head || !i.q) return;
    ++total;
    q4 += !i.q->q4.empty();
    f8 += !i.q->f8.empty();
  });
  if (q4 == 0 && f8 == 0) return "bf16";
  return q4 == total ? "int4" : f8 == total ? "fp8" : "mixed";
}

size_t weights_bytes(const ModelWeights& w) {
  size_t n = 0;
  for_each_linear(w, [&](const LinearInfo& i) {
    n += i.bf16->bytes();
    if (i.q) n += i.q->bytes();
  });
  return n;
}

}  // namespace kvant
