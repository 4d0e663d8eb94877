// The decoder's forward pass shared by every architecture: the step plan,
// the embedding, the layer loop and the logits. The per-family differences
// (QKV bias, QK-norm, post-norms, sliding windows, activation, embedding
// scale, soft-capping, MoE, latent and sparse attention) are switches in
// ModelConfig; the blocks live in model/blocks/. Every computation is a
// backend operation (backend/backend.h): nothing here touches activations.
#include "model/model.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "model/blocks/blocks.h"
#include "io/model_files.h"
#include "model/loader.h"
#include "model/model_impl.h"

namespace kvant {

using backend::CF32;
using backend::dense;
using backend::F32;

int64_t Batch::logit_rows() const {
  int64_t r = 0;
  for (auto& s : seqs) r += s.logit_count();
  return r;
}

namespace {
dist::ShardPlan whole_model(const ModelConfig& c) {
  auto p = dist::make_shard_plan(c, 1, 0, 1, 0);
  if (p) return *p;
  dist::ShardPlan s;  // a config the plan cannot read still runs whole
  s.q_heads = {0, c.heads};
  s.kv_heads = {0, c.cache_heads()};
  s.ffn = {0, c.ffn};
  s.shared_ffn = {0, c.moe_shared_ffn};
  s.moe_ffn = {0, c.moe_ffn};
  s.experts = {0, c.n_experts};
  s.vocab = {0, c.vocab};
  s.vocab_per_rank = s.vocab_padded = c.vocab;
  return s;
}
}  // namespace

Model::Model(ModelConfig cfg, ModelWeights w) : cfg_(std::move(cfg)) {
  full_cfg_ = cfg_;
  shard_ = whole_model(cfg_);
  sets_.push_back(std::move(w));
  be_ = backend::make_cpu_backend();
  inv_freq_ = rope_inv_freq(cfg_.rope, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  inv_freq_local_ = rope_inv_freq(cfg_.rope_local, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  ws_ = std::make_unique<Workspace>();
}

Model::Model(ModelConfig cfg, std::vector<ModelWeights> sets, int prefill_set, int decode_set,
             std::unique_ptr<backend::Backend> be)
    : cfg_(std::move(cfg)),
      sets_(std::move(sets)),
      prefill_set_(prefill_set),
      decode_set_(decode_set),
      be_(be ? std::move(be) : backend::make_cpu_backend()) {
  KV_CHECK(!sets_.empty());
  KV_CHECK(prefill_set_ >= 0 && prefill_set_ < int(sets_.size()));
  KV_CHECK(decode_set_ >= 0 && decode_set_ < int(sets_.size()));
  full_cfg_ = cfg_;
  shard_ = whole_model(cfg_);
  inv_freq_ = rope_inv_freq(cfg_.rope, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  inv_freq_local_ = rope_inv_freq(cfg_.rope_local, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  ws_ = std::make_unique<Workspace>();
}

Model::~Model() = default;

std::string Model::set_precision(int i) const { return weights_precision(sets_[size_t(i)]); }
size_t Model::set_bytes(int i) const { return weights_bytes(sets_[size_t(i)]); }

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const WeightOptions& opts) {
  auto files = ModelFiles::open(path);
  if (!files) return files.error();
  return load(**files, opts);
}

Result<void> check_parallelism(const Parallelism& par) {
  const int n = par.comm ? par.comm->size() : 1;
  if ((par.tp != 1 && par.tp != n) || (par.ep != 1 && par.ep != n) || std::max(par.tp, par.ep) != n)
    return make_error(std::to_string(n) + " process(es) run --tp " + std::to_string(par.tp) +
                      " --ep " + std::to_string(par.ep) +
                      ": each must be 1 or the number of processes (mpirun -np), and one of "
                      "them that number");
  return {};
}

Result<void> Model::set_parallelism(const Parallelism& par, const ModelConfig& full,
                                   const dist::ShardPlan& plan) {
  KV_TRY(check_parallelism(par));
  const int n = par.comm ? par.comm->size() : 1;
  comm_ = n > 1 ? par.comm : nullptr;
  tp_ = par.tp;
  ep_ = par.ep;
  full_cfg_ = full;
  shard_ = plan;
  cfg_ = dist::local_config(full, plan);
  if (cfg_.mla()) cfg_.kv_heads = cfg_.heads;
  return {};
}

Result<std::unique_ptr<Model>> Model::load(const ModelFiles& files, const WeightOptions& opts,
                                           const Parallelism& par) {
  KV_TRY(check_parallelism(par));
  const int ranks = par.comm ? par.comm->size() : 1, rank = par.comm ? par.comm->rank() : 0;
  // Resolve kNative to the checkpoint's form, then load each distinct form once.
  const WeightPrecision native = files.int4()  ? WeightPrecision::kInt4
                                 : files.fp8() ? WeightPrecision::kFp8
                                               : WeightPrecision::kBf16;
  auto resolve = [&](WeightPrecision p) { return p == WeightPrecision::kNative ? native : p; };
  const WeightPrecision want[2] = {resolve(opts.prefill), resolve(opts.decode)};
  // An INT4 checkpoint taken as it is keeps its BF16 linears (loader.h);
  // asked for int4, they are quantized: two different sets.
  const bool keep_bf16[2] = {opts.prefill == WeightPrecision::kNative && files.int4(),
                             opts.decode == WeightPrecision::kNative && files.int4()};
  auto be = backend::make_backend(opts.backend);
  if (!be) {
    std::string names;
    for (const auto& n : backend::available_backends()) names += (names.empty() ? "" : ", ") + n;
    return make_error("unknown backend '" + opts.backend + "' (this build runs: " + names + ")");
  }
  ModelConfig cfg;
  dist::ShardPlan plan;
  std::vector<ModelWeights> sets;
  std::vector<std::pair<WeightPrecision, bool>> loaded;
  int index[2] = {0, 0};
  for (int phase = 0; phase < 2; ++phase) {
    auto at = std::find(loaded.begin(), loaded.end(), std::make_pair(want[phase], keep_bf16[phase]));
    if (at != loaded.end()) {
      index[phase] = int(at - loaded.begin());
      continue;
    }
    WeightSetOptions so;
    so.precision = want[phase];
    so.keep_stored_bf16 = keep_bf16[phase];
    so.int4_group = opts.int4_group;
    so.int4_lm_head = opts.int4_lm_head;
    so.mtp = opts.mtp;
    so.backend = be.get();
    if (ranks > 1) {
      so.tp = par.tp, so.tp_rank = par.tp > 1 ? rank : 0;
      so.ep = par.ep, so.ep_rank = par.ep > 1 ? rank : 0;
      // Both sets split alike (their activations meet in one KV cache and
      // one workspace): in whole INT4 groups when either set is INT4 (a
      // checkpoint's own groups are taken as 128 at most), else in blocks of
      // 16 (SIMD-friendly, and small enough for the test models' sizes).
      // An FP8 set from an FP8 checkpoint keeps its codes only when columns
      // split at its 128-wide scale blocks.
      const bool any_int4 = want[0] == WeightPrecision::kInt4 || want[1] == WeightPrecision::kInt4;
      const bool any_fp8 = want[0] == WeightPrecision::kFp8 || want[1] == WeightPrecision::kFp8;
      so.shard_align = !any_int4 ? 16
                       : files.int4() ? std::max<int64_t>(128, opts.int4_group)
                                      : opts.int4_group;
      if (any_fp8 && files.fp8() && !any_int4) {
        so.shard_align = 128;
        so.shard_align_fallback = 16;
      }
    }
    auto m = load_model(files, so);
    if (!m) return m.error();
    cfg = std::move(m->config);
    plan = m->shard;
    index[phase] = int(sets.size());
    sets.push_back(std::move(m->weights));
    loaded.emplace_back(want[phase], keep_bf16[phase]);
  }
  const ModelConfig full = cfg;
  auto model = std::make_unique<Model>(std::move(cfg), std::move(sets), index[0], index[1],
                                       std::move(be));
  KV_TRY(model->set_parallelism(par, full, plan));
  return model;
}

void Model::reserve(int64_t tokens, int64_t context) {
  const auto& c = cfg_;
  // The BF16 context rows prefill gathers grow with the first long prefill
  // (they scale with prompt length, and decode never uses them).
  ensure_workspace(tokens, context, 0);
  backend::WorkspaceSize s;
  s.tokens = tokens;
  s.context = context;
  s.pages = context;
  s.widest_input = std::max({c.hidden, c.q_dim(), c.ffn, c.moe_ffn, c.moe_shared_ffn,
                             c.heads * c.v_head_dim, c.q_lora_rank, c.kv_lora_rank,
                             c.heads * c.qk_nope_dim, c.mla() ? c.cache_dim() : 0});
  s.score_rows = c.mla() ? 8 : c.heads / std::max<int64_t>(c.kv_heads, 1);
  s.heads = c.heads;
  s.experts = c.n_experts;
  s.expert_groups = c.moe_n_group;
  be_->reserve(s);
  // The step's metadata: at most one chunk per token.
  plan_.chunks.reserve(size_t(tokens));
  plan_.tokens.reserve(size_t(tokens));
  plan_.decode_chunks.reserve(size_t(tokens));
  plan_.decode_rows.reserve(size_t(tokens));
  segs_.reserve(size_t(tokens));
  logit_segs_.reserve(size_t(tokens));
}

void Model::ensure_workspace(int64_t T, int64_t ctx, int64_t gather_rows) {
  auto& ws = *ws_;
  const auto& c = cfg_;
  auto f32 = [&](backend::Buffer<float>& b, int64_t n) {
    if (int64_t(b.size()) < n) b = be_->alloc(size_t(n) * sizeof(float));
  };
  auto bf16 = [&](backend::Buffer<uint16_t>& b, int64_t n) {
    if (int64_t(b.size()) < n) b = be_->alloc(size_t(n) * sizeof(uint16_t));
  };
  if (T > ws.tokens) {
    const int64_t qkv = std::max(c.q_dim() + 2 * c.kv_dim(), c.mla() ? c.mla_first_width() : 0);
    for (auto* b : {&ws.x, &ws.h, &ws.out}) f32(*b, T * c.hidden);
    f32(ws.qkv, T * qkv);
    f32(ws.attn, T * std::max(c.q_dim(), c.heads * c.v_head_dim));
    f32(ws.gu, T * 2 * c.ffn);
    f32(ws.act, T * c.ffn);
    for (auto* b : {&ws.cos_g, &ws.sin_g, &ws.cos_l, &ws.sin_l}) f32(*b, T * c.head_dim / 2);
    if (c.mla()) {
      const int64_t H = c.heads, D = c.cache_dim();
      f32(ws.mq, T * c.q_dim());
      f32(ws.lat, T * D);
      f32(ws.mdq, T * H * c.qk_nope_dim);
      f32(ws.mql, T * H * D);
      f32(ws.mol, T * H * D);
      f32(ws.mdv, T * H * c.v_head_dim);
    }
    if (c.n_experts > 0) {
      // Rows: T * k routed pairs, or T for the shared experts, whichever is more.
      const int64_t Tk = T * std::max<int64_t>(c.moe_top_k, 1);
      const int64_t Fw = std::max(c.moe_ffn, c.moe_shared_ffn);
      f32(ws.moe_logits, T * c.n_experts);
      f32(ws.moe_w, Tk);
      f32(ws.moe_x, Tk * c.hidden);
      f32(ws.moe_gu, Tk * 2 * Fw);
      f32(ws.moe_act, Tk * Fw);
      f32(ws.moe_y, Tk * c.hidden);
      ws.moe_ids.resize(size_t(Tk));
      ws.moe_slot.resize(size_t(Tk));
      ws.moe_off.resize(size_t(c.n_experts + 1));
      ws.moe_fill.resize(size_t(c.n_experts));
    }
    if (c.mtp_layers > 0) {
      f32(ws.mtp_h, T * c.hidden);
      f32(ws.mtp_cat, T * 2 * c.hidden);
    }
    if (c.index_topk > 0) {
      f32(ws.iq, T * c.index_heads * c.index_head_dim);
      ws.sel.resize(size_t(T * c.index_topk));
      ws.sparse.resize(size_t(T));
    }
    ws.tokens = T;
  }
  ws.ctx = std::max(ws.ctx, ctx);
  if (gather_rows > ws.gather_rows) {
    if (c.mla()) {
      bf16(ws.gk, gather_rows * c.cache_dim());
      bf16(ws.ek, gather_rows * c.q_dim());
      bf16(ws.ev, gather_rows * c.heads * c.v_head_dim);
    } else {
      bf16(ws.gk, gather_rows * c.kv_dim());
      bf16(ws.gv, gather_rows * c.kv_dim());
    }
    ws.gather_rows = gather_rows;
  }
}

// Checks the batch and turns it into the step plan: each chunk's rows,
// pages and (prefill) gathered context, each token's position, and the row
// segments of each weight set.
Result<void> Model::plan_step(const Batch& b) {
  const auto& c = cfg_;
  const int64_t T = int64_t(b.tokens.size());
  backend::StepPlan& p = plan_;
  p.chunks.clear();
  p.tokens.clear();
  p.decode_chunks.clear();
  p.decode_rows.clear();
  p.max_ctx = p.max_pages = p.gather_rows = 0;
  p.any_prefill = false;
  // Rows [j0, end) in BF16 for prefill: the earliest query's window start
  // onwards, unless a full-attention layer needs every row.
  const bool any_full = c.sliding.empty() || c.sliding_window <= 0 ||
                        std::find(c.sliding.begin(), c.sliding.end(), 0) != c.sliding.end();
  int64_t t = 0;
  for (const auto& s : b.seqs) {
    if (!s.kv || !s.kv->format || s.n_tokens <= 0)
      return make_error("forward: empty sequence chunk");
    if (s.all_logits && (s.logit_skip < 0 || s.logit_skip >= s.n_tokens))
      return make_error("forward: logit_skip must leave at least one row of the chunk");
    const KvFormat& f = *s.kv->format;
    if (f.kv_heads != c.cache_heads() || f.head_dim != c.cache_dim())
      return make_error("forward: the KV pages have " + std::to_string(f.kv_heads) + " heads of " +
                        std::to_string(f.head_dim) + ", the model " + std::to_string(c.cache_heads()) +
                        " of " + std::to_string(c.cache_dim()));
    if (c.mla() && !f.shared_kv())
      return make_error("forward: latent-attention KV pages must share K and V (one row per token)");
    if (c.index_topk > 0 && f.index_dim != c.index_head_dim)
      return make_error("forward: the KV pages carry no sparse-attention indexer keys");
    if (f.elem != KvDType::kBf16 && !f.dynamic_scales &&
        (int64_t(f.static_k.size()) != c.kv_layers() * c.cache_heads() ||
         int64_t(f.static_v.size()) != c.kv_layers() * c.cache_heads()))
      return make_error("forward: static FP8 KV needs one K and one V scale per layer and KV head");
    if (s.pos0 < 0 || s.pos0 + s.n_tokens > s.kv->capacity())
      return make_error("forward: positions [" + std::to_string(s.pos0) + ", " +
                        std::to_string(s.pos0 + s.n_tokens) +
                        ") exceed the sequence's KV capacity " + std::to_string(s.kv->capacity()));
    backend::StepChunk ch{s.kv, s.pos0, s.n_tokens, t};
    const int64_t end = s.pos0 + s.n_tokens;
    p.max_ctx = std::max(p.max_ctx, end);
    p.max_pages = std::max(p.max_pages, s.kv->n_pages);
    // A single-token chunk reads its pages directly; longer chunks (and
    // soft-capped attention, which the paged kernel does not do) gather.
    if (s.n_tokens == 1 && c.attn_softcap <= 0.f) {
      p.decode_chunks.push_back(int64_t(p.chunks.size()));
      p.decode_rows.push_back(t);
    } else {
      const int64_t j0 = c.sliding_window > 0 && !c.sliding.empty()
                             ? std::max<int64_t>(0, s.pos0 - c.sliding_window + 1)
                             : 0;
      ch.gather_off = p.gather_rows;
      ch.gather_j0 = any_full ? 0 : j0;
      p.gather_rows += end - ch.gather_j0;
      p.any_prefill = true;
    }
    for (int64_t i = 0; i < s.n_tokens && t + i < T; ++i)
      p.tokens.push_back({int32_t(p.chunks.size()), s.pos0 + i});
    p.chunks.push_back(ch);
    t += s.n_tokens;
  }
  if (t != T) return make_error("forward: token count does not match the chunks");
  for (int32_t tok : b.tokens)
    if (tok < 0 || tok >= c.vocab)
      return make_error("forward: token id " + std::to_string(tok) +
                        " outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  // Row segments by weight set: one-token chunks decode, longer ones prefill.
  segs_.clear();
  logit_segs_.clear();
  auto push = [](std::vector<RowSegment>& v, int64_t a, int64_t e, int set) {
    if (!v.empty() && v.back().set == set && v.back().t1 == a)
      v.back().t1 = e;
    else
      v.push_back({a, e, set});
  };
  int64_t r = 0;
  t = 0;
  for (const auto& s : b.seqs) {
    const int set = s.n_tokens == 1 ? decode_set_ : prefill_set_;
    push(segs_, t, t + s.n_tokens, set);
    push(logit_segs_, r, r + s.logit_count(), set);
    t += s.n_tokens;
    r += s.logit_count();
  }
  return {};
}

Result<void> Model::forward(const Batch& b, std::span<float> logits) {
  const auto& c = cfg_;
  KV_TRY(plan_step(b));
  if (int64_t(logits.size()) < b.logit_rows() * c.vocab)
    return make_error("forward: logits buffer too small");
  const int64_t T = plan_.n_tokens();
  ensure_workspace(T, plan_.max_ctx, plan_.gather_rows);
  be_->begin_step(plan_);
  // Embedding lookup (BF16 rows -> FP32), scaled for Gemma.
  const F32 x = dense(ws_->x.data(), T, c.hidden);
  for (const auto& sg : segs_)
    be_->embed(sets_[size_t(sg.set)].embed, shard_.vocab.begin, b.tokens.data() + sg.t0,
               c.embed_scale, x.sub_rows(sg.t0, sg.t1 - sg.t0));
  reduce_tp(x);  // each id's row came from the one rank whose slice holds it
  rope_tables();
  for (int64_t l = 0; l < c.layers; ++l) layer_forward(l);
  logits_forward(b, logits);
  return {};
}

// Final norm and logits for the rows that want them (each row with its
// chunk's weight set), soft-capped where the model says.
void Model::logits_forward(const Batch& b, std::span<float> logits, bool mtp_head) {
  const auto& c = cfg_;
  const int64_t T = plan_.n_tokens();
  const F32 x = dense(ws_->x.data(), T, c.hidden), h = dense(ws_->h.data(), T, c.hidden);
  int64_t r = 0, t0 = 0;
  for (const auto& s : b.seqs) {
    const int set = s.n_tokens == 1 ? decode_set_ : prefill_set_;
    const int64_t n = s.logit_count(), first = t0 + s.n_tokens - n;
    const ModelWeights& W = sets_[size_t(set)];
    if (n > 0)
      be_->rmsnorm(x.sub_rows(first, n), mtp_head ? W.mtp[0].head_norm.data() : W.out_norm.data(),
                   c.rms_eps, h.sub_rows(r, n));
    r += n;
    t0 += s.n_tokens;
  }
  if (r == 0) return;
  // Under tensor parallelism each rank computes its vocabulary slice's
  // columns, padded to vocab_per_rank, then they are gathered.
  const bool split = comm_ && tp_ > 1;
  const int64_t width = split ? shard_.vocab_per_rank : c.vocab;
  if (split && int64_t(ws_->lg_local.size()) < r * width)
    ws_->lg_local = be_->alloc(size_t(r * width) * sizeof(float));
  const F32 out = split ? dense(ws_->lg_local.data(), r, width) : dense(logits.data(), r, c.vocab);
  const int64_t held = shard_.vocab.size();
  for (const auto& sg : logit_segs_) {
    const ModelWeights& W = sets_[size_t(sg.set)];
    if (held > 0 && sg.t1 > sg.t0)
      be_->linear(h.sub_rows(sg.t0, sg.t1 - sg.t0), {&W.lm_head(), &W.output_q},
                  out.sub_rows(sg.t0, sg.t1 - sg.t0).sub_cols(0, held));
  }
  if (split) gather_logits(r, logits);
  if (c.final_softcap > 0.f) be_->softcap(dense(logits.data(), r, c.vocab), c.final_softcap);
}

// Rank q's columns [q * vpr, q * vpr + its slice) of every row, from an
// all-gather of each rank's [rows, vpr] block (the padding past a short last
// slice is never read).
void Model::gather_logits(int64_t rows, std::span<float> logits) {
  const int64_t vpr = shard_.vocab_per_rank, V = cfg_.vocab, n = int64_t(tp_);
  const size_t block = size_t(rows * vpr) * sizeof(float);
  if (ws_->lg_all.size() < size_t(rows * vpr * n))
    ws_->lg_all = be_->alloc(block * size_t(n));
  collective([&] {
    return comm_->all_gather(
        std::as_bytes(std::span<const float>(ws_->lg_local.data(), size_t(rows * vpr))),
        std::as_writable_bytes(std::span<float>(ws_->lg_all.data(), size_t(rows * vpr * n))));
  });
  for (int64_t q = 0; q < n; ++q) {
    const int64_t c0 = q * vpr, w = std::max<int64_t>(0, std::min(vpr, V - c0));
    if (w == 0) continue;
    const float* src = ws_->lg_all.data() + q * rows * vpr;
    for (int64_t i = 0; i < rows; ++i)
      std::copy_n(src + i * vpr, w, logits.data() + i * V + c0);
  }
}

void Model::reduce_tp(F32 x) {
  if (!comm_ || tp_ <= 1) return;
  KV_CHECK(x.ld == x.cols);
  collective([&] { return comm_->all_reduce_sum(std::span<float>(x.data, size_t(x.rows * x.cols))); });
}

void Model::comm_failed(const Error& e) {
  std::fprintf(stderr, "kvant: rank %d of %d: %s; stopping every rank\n", comm_->rank(),
               comm_->size(), e.message.c_str());
  std::fflush(stderr);
  comm_->abort(3);
}

void Model::linear(int64_t l, int which, CF32 x, F32 y) {
  if (observer_ && !segs_.empty()) observer_(l, which, x.data, x.ld, segs_.back().t1);
  for (const auto& sg : segs_) {
    const LayerWeights& L = layer(sg.set, l);
    const Matrix* W[] = {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down};
    const QMatrix* W4[] = {&L.wqkv_q, &L.wo_q, &L.w_gate_up_q, &L.w_down_q};
    be_->linear(x.sub_rows(sg.t0, sg.t1 - sg.t0), {W[which], W4[which]},
                y.sub_rows(sg.t0, sg.t1 - sg.t0));
  }
}

void Model::layer_forward(int64_t l) {
  const auto& c = cfg_;
  auto& ws = *ws_;
  const int64_t H = c.hidden, T = plan_.n_tokens();
  const F32 x = dense(ws.x.data(), T, H), h = dense(ws.h.data(), T, H),
            out = dense(ws.out.data(), T, H);
  // Each segment's norms are its weight set's (the same values in every set).
  auto norm = [&](const std::vector<float> LayerWeights::*w, F32 in, F32 o) {
    for (const auto& sg : segs_) {
      const std::vector<float>& v = layer(sg.set, l).*w;
      if (v.empty()) continue;
      be_->rmsnorm(in.sub_rows(sg.t0, sg.t1 - sg.t0), v.data(), c.rms_eps,
                   o.sub_rows(sg.t0, sg.t1 - sg.t0));
    }
  };

  norm(&LayerWeights::attn_norm, x, h);
  if (c.mla()) {
    linear(l, 0, h, dense(ws.qkv.data(), T, c.mla_first_width(l)));
    mla_attention(l);
    linear(l, 1, dense(ws.attn.data(), T, c.heads * c.v_head_dim), out);
  } else {
    linear(l, 0, h, dense(ws.qkv.data(), T, c.q_dim() + 2 * c.kv_dim()));
    attention(l);
    linear(l, 1, dense(ws.attn.data(), T, c.q_dim()), out);
  }
  reduce_tp(out);  // each rank's heads' share of the output projection
  norm(&LayerWeights::post_attn_norm, out, out);
  be_->add(x, out);

  norm(&LayerWeights::ffn_norm, x, h);
  if (!c.moe_layer.empty() && c.moe_layer[size_t(l)])
    moe_forward(l);
  else
    mlp_forward(l);
  norm(&LayerWeights::post_ffn_norm, out, out);
  be_->add(x, out);
}

}  // namespace kvant
