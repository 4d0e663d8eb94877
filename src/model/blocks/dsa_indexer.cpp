// GLM-5's sparse-attention indexer for one layer: each token's index key
// (LayerNorm, RoPE on its first qk_rope values, interleaved) into its page as
// BF16; each token's queries (from the normed q_a) and head weights score
// every cached key, and the index_topk best are kept (backend dsa_select).
// Tokens with no more than index_topk of context keep everything. Layers
// that share the choice reuse what this layer left in the workspace.
#include "model/blocks/blocks.h"
#include "model/model_impl.h"

namespace kvant {

using backend::dense;
using backend::F32;

void Model::mla_index(int64_t l) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t T = plan_.n_tokens(), ih = c.index_heads, ihd = c.index_head_dim,
                dr = c.qk_rope_dim, hh = c.head_dim / 2;
  const int64_t qa = c.q_lora_rank, ko = qa + c.cache_dim();
  const LayerWeights& L0 = layer(0, l);
  const F32 first = dense(ws.qkv.data(), T, c.mla_first_width(l));
  const F32 cos{ws.cos_g.data(), T, hh, hh}, sin{ws.sin_g.data(), T, hh, hh};
  const F32 keys = first.sub_cols(ko, ihd);
  be_->layernorm(keys, L0.idx_k_norm.data(), L0.idx_k_bias.data(), 1e-6);
  be_->rope(keys, 1, ihd, dr, cos, sin, true);
  be_->kv_store_index(plan_, l, keys);
  const F32 iq = dense(ws.iq.data(), T, ih * ihd);
  for (const auto& sg : segs_) {
    const LayerWeights& L = layer(sg.set, l);
    be_->linear(first.sub_cols(0, qa).sub_rows(sg.t0, sg.t1 - sg.t0), {&L.idx_wq_b, nullptr},
                iq.sub_rows(sg.t0, sg.t1 - sg.t0));
  }
  be_->rope(iq, ih, ihd, dr, cos, sin, true);
  be_->dsa_select(plan_, l, iq, first.sub_cols(ko + ihd, ih), ih, ihd, c.index_topk,
                  ws.sel.data(), ws.sparse.data());
}

}  // namespace kvant
