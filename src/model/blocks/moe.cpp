// The routed MLP (Qwen3-MoE, DeepSeek-V3 / Kimi K2, GLM-4.5/5) on the normed
// rows, grouped by expert: each expert's tokens are gathered into
// consecutive rows and go through its products together, then every token
// sums its experts' outputs in ascending expert order (so a token's result
// does not depend on the batch). Shared experts see every token and are
// added after the routed sum. Each row segment uses its weight set's experts.
#include <span>

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
    for (int64_t e = shard_.experts.begin; e < shard_.experts.end; ++e) {
      const int64_t r0 = ws.moe_off[size_t(e)], m = ws.moe_off[size_t(e + 1)] - r0;
      if (m == 0) continue;
      const ExpertWeights& X = L.experts[size_t(e)];
      be_->linear(xs.sub_rows(r0, m), {&X.gate_up, &X.gate_up_q}, gu.sub_rows(r0, m));
      be_->gated_act(gate_act(c.act), gu.sub_rows(r0, m), act.sub_rows(r0, m));
      be_->linear(act.sub_rows(r0, m), {&X.down, &X.down_q}, ys.sub_rows(r0, m));
    }
    if (ep_ > 1)
      moe_combine_ep(n, os);  // exact: each token's experts summed on its owner
    else
      be_->moe_combine(ys, ws.moe_w.data(), ws.moe_slot.data(), k, os);
    if (c.moe_shared_ffn > 0) {
      const int64_t S = c.moe_shared_ffn;
      const backend::F32 sgu = dense(ws.moe_gu.data(), n, 2 * S), sact = dense(ws.moe_act.data(), n, S);
      const backend::F32 sy = dense(ws.moe_y.data(), n, H);
      be_->linear(hs, {&L.shared.gate_up, &L.shared.gate_up_q}, sgu);
      be_->gated_act(backend::GateAct::kSilu, sgu, sact);
      be_->linear(sact, {&L.shared.down, &L.shared.down_q}, sy);
      if (ep_ > 1) reduce_tp(sy);  // the routed sum is whole already
      be_->add(os, sy);
    }
  }
  // Without EP every rank holds a slice of every expert (and of the shared
  // ones): one all-reduce sums the slices.
  if (ep_ <= 1) reduce_tp(out);
}

// Expert parallelism's combine for the n rows of one segment (ws.moe_* as
// moe_forward left them: ids, weights, slots, and ys holding this rank's
// experts' output rows). Token t belongs to rank t / per (per = ceil(n /
// ranks)); expert e to rank e / (E / ranks). Each rank sends the owner of
// every token the output rows of its own experts for that token, in (token,
// choice) order; the owner knows the routing too, so it knows where each
// arrives without being told. The owner sums each token's k rows in
// ascending expert order, as one process does, and an all-gather of the
// owners' rows gives every rank the whole block (the all-gather's rows are
// in token order already: rank q's block starts at row q * per).
void Model::moe_combine_ep(int64_t n, backend::F32 os) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t H = c.hidden, k = c.moe_top_k, N = comm_->size(), me = comm_->rank();
  const int64_t per = (n + N - 1) / N, per_rank_experts = c.n_experts / N;
  auto owner = [&](int32_t e) { return int64_t(e) / per_rank_experts; };
  auto tokens_of = [&](int64_t q) {
    return std::pair{std::min(n, q * per), std::min(n, (q + 1) * per)};
  };
  const int32_t* ids = ws.moe_ids.data();
  ws.ep_src_rows.clear();
  ws.ep_send_bytes.assign(size_t(N), 0);
  ws.ep_recv_bytes.assign(size_t(N), 0);
  for (int64_t q = 0; q < N; ++q) {
    const auto [a, b] = tokens_of(q);
    const size_t before = ws.ep_src_rows.size();
    for (int64_t i = a * k; i < b * k; ++i)
      if (owner(ids[i]) == me) ws.ep_src_rows.push_back(ws.moe_slot[size_t(i)]);
    ws.ep_send_bytes[size_t(q)] = (ws.ep_src_rows.size() - before) * size_t(H) * sizeof(float);
  }
  const auto [a, b] = tokens_of(me);
  const int64_t mine = b - a;
  std::vector<int64_t>& fill = ws.ep_fill;
  std::vector<int64_t>& base = ws.ep_base;
  fill.assign(size_t(N), 0);
  base.assign(size_t(N) + 1, 0);
  for (int64_t i = a * k; i < b * k; ++i) ++base[size_t(owner(ids[i])) + 1];
  for (int64_t q = 0; q < N; ++q) {
    ws.ep_recv_bytes[size_t(q)] = size_t(base[size_t(q) + 1] * H) * sizeof(float);
    base[size_t(q) + 1] += base[size_t(q)];
  }
  ws.ep_recv_slot.resize(size_t(mine * k));
  for (int64_t i = a * k; i < b * k; ++i) {
    const int64_t q = owner(ids[i]);
    ws.ep_recv_slot[size_t(i - a * k)] = base[size_t(q)] + fill[size_t(q)]++;
  }
  const int64_t sent = int64_t(ws.ep_src_rows.size()), got = base[size_t(N)];
  auto grow = [&](backend::Buffer<float>& buf, int64_t floats) {
    if (int64_t(buf.size()) < floats) buf = be_->alloc(size_t(std::max<int64_t>(floats, 1)) * sizeof(float));
  };
  grow(ws.ep_send, sent * H);
  grow(ws.ep_recv, got * H);
  grow(ws.ep_own, per * H);
  grow(ws.ep_all, N * per * H);
  const backend::F32 ys = dense(ws.moe_y.data(), n * k, H);
  const backend::F32 send = dense(ws.ep_send.data(), sent, H), recv = dense(ws.ep_recv.data(), got, H);
  if (sent > 0) be_->copy_rows(ys, ws.ep_src_rows.data(), send, nullptr, sent);
  collective([&] {
    return comm_->all_to_all_v(
        std::as_bytes(std::span<const float>(ws.ep_send.data(), size_t(sent * H))),
        ws.ep_send_bytes,
        std::as_writable_bytes(std::span<float>(ws.ep_recv.data(), size_t(got * H))),
        ws.ep_recv_bytes);
  });
  const backend::F32 own = dense(ws.ep_own.data(), per, H);
  if (mine > 0)
    be_->moe_combine(recv, ws.moe_w.data() + a * k, ws.ep_recv_slot.data(), k, own.sub_rows(0, mine));
  collective([&] {
    return comm_->all_gather(
        std::as_bytes(std::span<const float>(ws.ep_own.data(), size_t(per * H))),
        std::as_writable_bytes(std::span<float>(ws.ep_all.data(), size_t(N * per * H))));
  });
  be_->copy_rows(dense(ws.ep_all.data(), N * per, H), nullptr, os, nullptr, n);
}

}  // namespace kvant
