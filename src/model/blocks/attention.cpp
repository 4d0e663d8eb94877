// Grouped-query attention (Llama, Qwen, Gemma, GLM-4.5): bias, QK-norm and
// RoPE on the fresh q/k rows, the K/V rows into their pages, then decode
// chunks attend straight from the pages and prefill chunks over their
// gathered BF16 context (sliding windows and soft-capping as configured).
#include "model/blocks/blocks.h"
#include "model/model_impl.h"

namespace kvant {

using backend::dense;
using backend::F32;

void Model::attention(int64_t l) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t T = plan_.n_tokens(), hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t hh = hd / 2;
  // Biases and QK-norms are the same in every weight set.
  const LayerWeights& L = layer(0, l);
  const F32 qkv = dense(ws.qkv.data(), T, qd + 2 * kvd);
  const bool sliding = c.sliding[size_t(l)] && c.sliding_window > 0;
  const F32 cos{(sliding ? ws.cos_l : ws.cos_g).data(), T, hh, hh};
  const F32 sin{(sliding ? ws.sin_l : ws.sin_g).data(), T, hh, hh};

  if (!L.bqkv.empty()) be_->add_bias(qkv, L.bqkv.data());
  if (c.qk_norm) {
    be_->rmsnorm_heads(qkv, c.heads, hd, L.q_norm.data(), c.rms_eps);
    be_->rmsnorm_heads(qkv.sub_cols(qd, kvd), c.kv_heads, hd, L.k_norm.data(), c.rms_eps);
  }
  be_->rope(qkv, c.heads + c.kv_heads, hd, c.rope_dim(), cos, sin, false);
  const F32 k = qkv.sub_cols(qd, kvd), v = qkv.sub_cols(qd + kvd, kvd);
  be_->kv_store(plan_, l, k, v);

  const F32 out = dense(ws.attn.data(), T, qd);
  const int64_t window = sliding ? c.sliding_window : 0;
  backend::DecodeAttn d;
  d.layer = l;
  d.q = qkv;
  d.out = out;
  d.heads = c.heads;
  d.kv_heads = c.kv_heads;
  d.head_dim = hd;
  d.head_block = c.heads / c.kv_heads;
  d.scale = c.attn_scale;
  d.window = window;
  be_->attention_decode(plan_, d);
  if (!plan_.any_prefill) return;

  const backend::BF16 gk = dense(ws.gk.data(), plan_.gather_rows, kvd);
  const backend::BF16 gv = dense(ws.gv.data(), plan_.gather_rows, kvd);
  be_->kv_gather(plan_, l, k, v, gk, gv);
  backend::PrefillAttn p;
  p.q = qkv;
  p.k = gk;
  p.v = gv;
  p.out = out;
  p.heads = c.heads;
  p.group = c.heads / c.kv_heads;
  p.head_dim = p.v_dim = hd;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = hd;
  p.scale = c.attn_scale;
  p.softcap = c.attn_softcap;
  p.window = window;
  be_->attention_prefill(plan_, p);
}

}  // namespace kvant
