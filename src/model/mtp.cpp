// Multi-token prediction (DeepSeek-V3's MTP module, GLM-4.5's next-n
// layer): the draft for the token after next from the main model's hidden
// state and the next token. For position p,
//   x = eh_proj([enorm(embed(t[p+1])) ; hnorm(h[p])])
// then one decoder layer of the model's own kind at position p (its K/V in
// the cache's layer `layers`, attending over the earlier positions' MTP
// rows), then the MTP layer's norm and the model's output head. The rows
// come from the last forward, so this runs right after it, before the
// workspace is reused.
#include "model/model.h"
#include "model/model_impl.h"

namespace kvant {

using backend::dense;
using backend::F32;

Result<void> Model::forward_mtp(const Batch& b, std::span<const int64_t> src_row0,
                                std::span<float> logits) {
  const auto& c = cfg_;
  if (c.mtp_layers <= 0)
    return make_error("forward_mtp: the model was loaded without its multi-token-prediction layer");
  if (src_row0.size() != b.seqs.size())
    return make_error("forward_mtp: one source row per chunk");
  const int64_t prev = plan_.n_tokens(), H = c.hidden;
  auto& ws = *ws_;
  // The main hidden rows, gathered before anything overwrites them.
  ws.mtp_src.clear();
  for (size_t k = 0; k < b.seqs.size(); ++k) {
    const int64_t n = b.seqs[k].n_tokens;
    if (src_row0[k] < 0 || n < 0 || src_row0[k] + n > prev)
      return make_error("forward_mtp: source rows outside the last forward's " +
                        std::to_string(prev));
    for (int64_t i = 0; i < n; ++i) ws.mtp_src.push_back(src_row0[k] + i);
  }
  const int64_t T = int64_t(ws.mtp_src.size());
  if (T == 0) return {};
  if (int64_t(ws.mtp_h.size()) < T * H) ws.mtp_h = be_->alloc(size_t(T * H) * sizeof(float));
  be_->copy_rows(dense(ws.x.data(), prev, H), ws.mtp_src.data(), dense(ws.mtp_h.data(), T, H),
                 nullptr, T);
  KV_TRY(plan_step(b));
  if (int64_t(logits.size()) < b.logit_rows() * c.vocab)
    return make_error("forward_mtp: logits buffer too small");
  ensure_workspace(T, plan_.max_ctx, plan_.gather_rows);
  if (int64_t(ws.mtp_cat.size()) < T * 2 * H)
    ws.mtp_cat = be_->alloc(size_t(T * 2 * H) * sizeof(float));
  be_->begin_step(plan_);
  const F32 x = dense(ws.x.data(), T, H), hid = dense(ws.mtp_h.data(), T, H);
  const F32 cat = dense(ws.mtp_cat.data(), T, 2 * H);
  for (const auto& sg : segs_)
    be_->embed(sets_[size_t(sg.set)].embed, shard_.vocab.begin, b.tokens.data() + sg.t0,
               c.embed_scale, x.sub_rows(sg.t0, sg.t1 - sg.t0));
  reduce_tp(x);  // vocabulary-parallel embedding, as in forward()
  for (const auto& sg : segs_) {
    const ModelWeights& W = sets_[size_t(sg.set)];
    const int64_t n = sg.t1 - sg.t0;
    be_->rmsnorm(x.sub_rows(sg.t0, n), W.mtp[0].enorm.data(), c.rms_eps,
                 cat.sub_rows(sg.t0, n).sub_cols(0, H));
    be_->rmsnorm(hid.sub_rows(sg.t0, n), W.mtp[0].hnorm.data(), c.rms_eps,
                 cat.sub_rows(sg.t0, n).sub_cols(H, H));
    be_->linear(cat.sub_rows(sg.t0, n), {&W.mtp[0].eh_proj, nullptr}, x.sub_rows(sg.t0, n));
  }
  rope_tables();
  layer_forward(c.layers);
  logits_forward(b, logits, true);
  return {};
}

}  // namespace kvant
