// Multi-head latent attention (DeepSeek-V3, Kimi K2, GLM-5). Each token
// caches one row per layer, the normed latent c (kv_lora_rank) and the roped
// shared key k_pe, in the page dtype with one scale for the whole row.
// Decode absorbs the up-projections: head h's query becomes [W_uk_h^T
// q_nope_h, q_pe_h], so it attends over the cached rows as a single KV head
// of width D (the row is K and V at once), and its output is W_uv_h applied
// to the attended latent. Prefill expands the rows it attends over into
// per-head K = [W_uk_h c, k_pe] and V = W_uv_h c (BF16) and runs the usual
// causal attention.
#include "model/blocks/blocks.h"
#include "model/model_impl.h"

namespace kvant {

using backend::dense;
using backend::F32;

void Model::mla_attention(int64_t l) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t T = plan_.n_tokens(), H = c.heads, qk = c.head_dim, nope = c.qk_nope_dim,
                dr = c.qk_rope_dim, R = c.kv_lora_rank, D = R + dr, dv = c.v_head_dim,
                hh = c.head_dim / 2;
  const int64_t qa = c.q_lora_rank > 0 ? c.q_lora_rank : H * qk;
  const int64_t ldx = c.mla_first_width(l);
  const LayerWeights& L0 = layer(0, l);  // norms: the same in every set
  constexpr float kLatentEps = 1e-6f;  // q_a / kv_a norms use the RMSNorm default, not rms_norm_eps
  const bool il = c.rope_interleave;
  const F32 first = dense(ws.qkv.data(), T, ldx), lat = dense(ws.lat.data(), T, D);
  const F32 cos{ws.cos_g.data(), T, hh, hh}, sin{ws.sin_g.data(), T, hh, hh};

  // Latent rows (normed c | roped k_pe) and the normed q_a.
  if (c.q_lora_rank > 0)
    be_->rmsnorm(first.sub_cols(0, qa), L0.q_a_norm.data(), kLatentEps, first.sub_cols(0, qa));
  be_->rmsnorm(first.sub_cols(qa, R), L0.kv_a_norm.data(), kLatentEps, lat.sub_cols(0, R));
  be_->copy_rows(first.sub_cols(qa + R, dr), nullptr, lat.sub_cols(R, dr), nullptr, T);
  be_->rope(lat.sub_cols(R, dr), 1, dr, dr, cos, sin, il);
  // Queries [T, H*qk] (q_b of the normed q_a, or q_proj's rows directly).
  F32 q = first.sub_cols(0, H * qk);
  if (c.q_lora_rank > 0) {
    q = dense(ws.mq.data(), T, c.q_dim());
    for (const auto& sg : segs_) {
      const LayerWeights& L = layer(sg.set, l);
      be_->linear(first.sub_cols(0, qa).sub_rows(sg.t0, sg.t1 - sg.t0), {&L.wq_b, &L.wq_b_q},
                  q.sub_rows(sg.t0, sg.t1 - sg.t0));
    }
  }
  be_->rope(q.sub_cols(nope, H * qk - nope), H, qk, dr, cos, sin, il);
  be_->kv_store(plan_, l, lat, {});  // one row, one scale, K and V at once
  if (c.index_topk > 0 && c.index_full[size_t(l)]) mla_index(l);

  backend::DecodeAttn d;
  const int64_t Td = int64_t(plan_.decode_chunks.size());
  if (Td > 0) {
    // Absorbed queries, paged attention over the latent rows, W_uv.
    const LayerWeights& Ld = layer(decode_set_, l);
    const int64_t* rows = plan_.decode_rows.data();
    const F32 mdq = dense(ws.mdq.data(), Td, H * nope), mql = dense(ws.mql.data(), Td, H * D);
    const F32 mol = dense(ws.mol.data(), Td, H * D), mdv = dense(ws.mdv.data(), Td, H * dv);
    for (int64_t h = 0; h < H; ++h) {
      be_->copy_rows(q.sub_cols(h * qk, nope), rows, mdq.sub_cols(h * nope, nope), nullptr, Td);
      be_->copy_rows(q.sub_cols(h * qk + nope, dr), rows, mql.sub_cols(h * D + R, dr), nullptr, Td);
    }
    for (int64_t h = 0; h < H; ++h)
      be_->linear(mdq.sub_cols(h * nope, nope), {&Ld.w_uk_t[size_t(h)], nullptr},
                  mql.sub_cols(h * D, R));
    d.layer = l;
    d.q = mql;
    d.out = mol;
    d.rows_by_token = false;
    d.heads = H;
    d.kv_heads = 1;
    d.head_dim = D;
    d.head_block = 8;
    d.scale = c.attn_scale;
    if (c.index_topk > 0) {
      d.sel = ws.sel.data();
      d.sparse = ws.sparse.data();
      d.topk = c.index_topk;
    }
    be_->attention_decode(plan_, d);
    for (int64_t h = 0; h < H; ++h)
      be_->linear(mol.sub_cols(h * D, D), {&Ld.w_uv[size_t(h)], nullptr}, mdv.sub_cols(h * dv, dv));
    be_->copy_rows(mdv, nullptr, dense(ws.attn.data(), T, H * dv), rows, Td);
  }
  if (!plan_.any_prefill) return;

  // Prefill: the chunk's context rows in BF16 (earlier ones decoded from the
  // pages, its own from the fresh FP32 rows), expanded to per-head K and V.
  const LayerWeights& Lp = layer(prefill_set_, l);
  const int64_t rows = plan_.gather_rows;
  const backend::BF16 gk = dense(ws.gk.data(), rows, D);
  const backend::BF16 ek = dense(ws.ek.data(), rows, c.q_dim()), ev = dense(ws.ev.data(), rows, H * dv);
  be_->kv_gather(plan_, l, lat, {}, gk, {});
  be_->mla_expand({gk, &Lp.wkv_b, H, nope, dr, dv, R, ek, ev});
  backend::PrefillAttn p;
  p.q = q;
  p.k = ek;
  p.v = ev;
  p.out = dense(ws.attn.data(), T, H * dv);
  p.heads = H;
  p.group = 1;
  p.head_dim = qk;
  p.v_dim = dv;
  p.q_head_stride = p.k_head_stride = qk;
  p.v_head_stride = dv;
  p.scale = c.attn_scale;
  if (c.index_topk > 0) {
    p.sel = ws.sel.data();
    p.sparse = ws.sparse.data();
    p.topk = c.index_topk;
  }
  be_->attention_prefill(plan_, p);
}

}  // namespace kvant
