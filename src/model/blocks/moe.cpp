// The routed MLP (Qwen3-MoE, DeepSeek-V3 / Kimi K2, GLM-4.5/5) on the normed
// rows, grouped by expert: each expert's tokens are gathered into
// consecutive rows and go through its products together, then every token
// sums its experts' outputs in ascending expert order (so a token's result
// does not depend on the batch). Shared experts see every token and are
// added after the routed sum. Each row segment uses its weight set's experts.
#include "model/blocks/blocks.h"
#include "model/model_impl.h"

namespace kvant {

using backend::dense;

void Model::moe_forward(int64_t l) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t T = plan_.n_tokens(), H = c.hidden, F = c.moe_ffn, E = c.n_experts,
                k = c.moe_top_k;
  const RouterConfig rc{c.moe_sigmoid ? RouterScoring::kSigmoid : RouterScoring::kSoftmax,
                        int(E), int(k), int(c.moe_n_group), int(c.moe_topk_group),
                        c.moe_norm_topk, c.moe_scaling};
  const backend::F32 h = dense(ws.h.data(), T, H), out = dense(ws.out.data(), T, H);
  for (const auto& sg : segs_) {
    const LayerWeights& L = layer(sg.set, l);
    const int64_t n = sg.t1 - sg.t0;
    const backend::F32 hs = h.sub_rows(sg.t0, n), os = out.sub_rows(sg.t0, n);
    const backend::F32 logits = dense(ws.moe_logits.data(), n, E);
    be_->linear(hs, {&L.router, nullptr}, logits);
    be_->moe_route(rc, logits, L.router_bias.empty() ? nullptr : L.router_bias.data(),
                   ws.moe_ids.data(), ws.moe_w.data());
    const backend::F32 xs = dense(ws.moe_x.data(), n * k, H), ys = dense(ws.moe_y.data(), n * k, H);
    const backend::F32 gu = dense(ws.moe_gu.data(), n * k, 2 * F), act = dense(ws.moe_act.data(), n * k, F);
    const backend::MoeSort sort{ws.moe_off.data(), ws.moe_slot.data(), ws.moe_fill.data()};
    be_->moe_permute(ws.moe_ids.data(), k, E, hs, xs, sort);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = ws.moe_off[size_t(e)], m = ws.moe_off[size_t(e + 1)] - r0;
      if (m == 0) continue;
      const ExpertWeights& X = L.experts[size_t(e)];
      be_->linear(xs.sub_rows(r0, m), {&X.gate_up, &X.gate_up_q4}, gu.sub_rows(r0, m));
      be_->gated_act(gate_act(c.act), gu.sub_rows(r0, m), act.sub_rows(r0, m));
      be_->linear(act.sub_rows(r0, m), {&X.down, &X.down_q4}, ys.sub_rows(r0, m));
    }
    be_->moe_combine(ys, ws.moe_w.data(), ws.moe_slot.data(), k, os);
    if (c.moe_shared_ffn > 0) {
      const int64_t S = c.moe_shared_ffn;
      const backend::F32 sgu = dense(ws.moe_gu.data(), n, 2 * S), sact = dense(ws.moe_act.data(), n, S);
      const backend::F32 sy = dense(ws.moe_y.data(), n, H);
      be_->linear(hs, {&L.shared.gate_up, &L.shared.gate_up_q4}, sgu);
      be_->gated_act(backend::GateAct::kSilu, sgu, sact);
      be_->linear(sact, {&L.shared.down, &L.shared.down_q4}, sy);
      be_->add(os, sy);
    }
  }
}

}  // namespace kvant
