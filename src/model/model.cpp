// The decoder forward pass shared by every dense architecture; the per-family
// differences (QKV bias, QK-norm, post-norms, sliding windows, activation,
// embedding scale, soft-capping) are switches in ModelConfig.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/kernels.h"
#include "model/loader.h"
#include "model/moe_router.h"
#include "model/ops.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant {

int64_t Batch::logit_rows() const {
  int64_t r = 0;
  for (auto& s : seqs) r += s.logit_count();
  return r;
}

namespace {
// Prefill attention takes this many consecutive tokens of one head per task,
// so each K and V row is read once for all of them (attn_*_multi).
constexpr int64_t kPrefillQueries = 4;

// A single-token chunk reads its pages directly; longer chunks (and soft-capped
// attention, which the paged kernel does not do) gather BF16 rows.
bool decodes_paged_impl(const ModelConfig& c, const SeqChunk& s) {
  return s.n_tokens == 1 && c.attn_softcap <= 0.f;
}
}  // namespace

struct TokenRef {  // where token t of the batch sits: its chunk and index in it
  const SeqChunk* s;
  int64_t t, i;
};

struct Model::Workspace {
  int64_t tokens = 0, ctx = 0;
  std::vector<TokenRef> items;  // [T], rebuilt each forward (capacity kept)
  AlignedBuffer<float> x, h, qkv, attn, gu, act, out;
  // MoE layers: router logits [T, E], the chosen experts and weights [T, k],
  // where each (token, choice) row sits in the expert-sorted buffers, and
  // those buffers: inputs [T*k, H], gate|up [T*k, 2F], act [T*k, F], out [T*k, H].
  AlignedBuffer<float> moe_logits, moe_w, moe_x, moe_gu, moe_act, moe_y, moe_scratch;
  std::vector<int32_t> moe_ids;
  std::vector<int64_t> moe_slot, moe_count, moe_fill;  // capacity kept: no allocation per step
  AlignedBuffer<uint16_t> xb;
  ops::Q8Scratch q8;  // activations quantized for INT4 products
  AlignedBuffer<float> cos_g, sin_g, cos_l, sin_l;  // [T, hd/2]
  AlignedBuffer<float> scores;                      // [threads, max(group, kPrefillQueries) * ctx]
  // Prefill attention reads BF16 rows gathered per sequence: [rows, kv_dim].
  AlignedBuffer<uint16_t> gk, gv;
  std::vector<int64_t> gather_off;     // [seqs]: first row of each chunk's gather, -1 = none
  std::vector<int64_t> gather_j0;      // [seqs]: position of that first row
  AlignedBuffer<const uint8_t*> ptrs;  // [threads, 4 * max_pages] page pointers for paged reads
  int64_t max_pages = 0, gather_rows = 0;
  struct Task {
    int64_t seq;    // chunk index
    int64_t a;      // decode: KV head; prefill: token index in the batch
    int64_t b;      // prefill: query head
    int64_t n = 1;  // prefill: consecutive tokens of the chunk (one query each)
  };
  std::vector<Task> decode_tasks, prefill_tasks;
  // Multi-head latent attention: queries [T, heads*qk]; cache rows (normed
  // latent | roped k_pe) [T, D]; decode tokens' q_nope [Td, heads*nope],
  // absorbed queries and latent outputs [Td, heads*D], head outputs
  // [Td, heads*v]; prefill's expanded K [rows, heads*qk] and V [rows,
  // heads*v] (BF16), expanded in blocks of kExpandRows through FP32.
  AlignedBuffer<float> mq, lat, mdq, mql, mol, mdv, mexp_in, mexp;
  AlignedBuffer<uint16_t> ek, ev, mxb;
  std::vector<int64_t> dec_tok;
  // DSA: indexer queries [T, index_heads*index_head_dim], each token's chosen
  // positions [T, index_topk] (ascending) and whether it has a choice (more
  // than index_topk tokens of context), per-thread scores, order and masks.
  std::vector<float> iq, iscore;
  std::vector<int32_t> sel, iorder;
  std::vector<uint8_t> sparse, keep;
};

namespace {

// MLA prefill expands cached latent rows into K and V this many at a time.
constexpr int64_t kExpandRows = 256;

// RoPE on n values: interleaved pairs (x[2i], x[2i+1]) or the two halves.
void rope_rows(float* x, const float* cos, const float* sin, int64_t n, bool interleave) {
  if (!interleave) return ops::rope(x, cos, sin, n);
  for (int64_t i = 0; i < n / 2; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos[i] - b * sin[i];
    x[2 * i + 1] = b * cos[i] + a * sin[i];
  }
}

std::vector<float> inv_freq_for(const RopeConfig& r, int64_t hd,
                                const std::vector<float>& factors) {
  std::vector<float> f(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) {
    // As transformers computes it: base ** (2i/d) in FP32, then 1/x.
    float e = float(2 * i) / float(hd);
    f[size_t(i)] = 1.f / float(std::pow(double(r.theta), double(e)));
  }
  if (!factors.empty())
    for (int64_t i = 0; i < hd / 2; ++i) f[size_t(i)] /= factors[size_t(i)];
  if (r.scaling == RopeScaling::Yarn) {
    // As transformers' YaRN: a linear ramp over the dimensions between the
    // correction range blends interpolated (f / factor) and extrapolated (f)
    // frequencies.
    const double base = double(r.theta), dim = double(hd);
    auto corr = [&](double rot) {
      return dim * std::log(double(r.original_max_positions) / (rot * 2 * M_PI)) / (2 * std::log(base));
    };
    double lo = corr(r.beta_fast), hi = corr(r.beta_slow);
    if (r.truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0);
    hi = std::min(hi, dim - 1);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < hd / 2; ++i) {
      const float ramp = std::clamp(float((double(i) - lo) / (hi - lo)), 0.f, 1.f);
      const float extra = 1.f - ramp;
      const float fe = f[size_t(i)], fi = fe / r.factor;
      f[size_t(i)] = fi * (1.f - extra) + fe * extra;
    }
  } else if (r.scaling == RopeScaling::Linear) {
    for (auto& x : f) x /= r.factor;
  } else if (r.scaling == RopeScaling::Llama3) {
    const double old_ctx = double(r.original_max_positions);
    const double low_wl = old_ctx / r.low_freq_factor, high_wl = old_ctx / r.high_freq_factor;
    for (auto& x : f) {
      const double wl = 2.0 * M_PI / x;
      if (wl < high_wl) continue;
      if (wl > low_wl) {
        x = float(x / r.factor);
        continue;
      }
      const double s =
          (old_ctx / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      x = float((1.0 - s) * x / r.factor + s * x);
    }
  }
  return f;
}

}  // namespace

Model::Model(ModelConfig cfg, ModelWeights w) : cfg_(std::move(cfg)) {
  sets_.push_back(std::move(w));
  inv_freq_ = inv_freq_for(cfg_.rope, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  inv_freq_local_ = inv_freq_for(cfg_.rope_local, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  ws_ = std::make_unique<Workspace>();
}

Model::Model(ModelConfig cfg, std::vector<ModelWeights> sets, int prefill_set, int decode_set)
    : cfg_(std::move(cfg)), sets_(std::move(sets)), prefill_set_(prefill_set), decode_set_(decode_set) {
  KV_CHECK(!sets_.empty());
  KV_CHECK(prefill_set_ >= 0 && prefill_set_ < int(sets_.size()));
  KV_CHECK(decode_set_ >= 0 && decode_set_ < int(sets_.size()));
  inv_freq_ = inv_freq_for(cfg_.rope, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  inv_freq_local_ = inv_freq_for(cfg_.rope_local, cfg_.rope_dim(), sets_[0].rope_freq_factors);
  ws_ = std::make_unique<Workspace>();
}

std::string Model::set_precision(int i) const {
  int q4 = 0, total = 0;
  for (const auto& L : sets_[size_t(i)].layers) {
    for (const Q4Matrix* m : {&L.wqkv_q4, &L.wo_q4}) {
      q4 += !m->empty();
      ++total;
    }
    if (L.wq_b.rows || !L.wq_b_q4.empty()) {
      q4 += !L.wq_b_q4.empty();
      ++total;
    }
    if (L.experts.empty()) {
      for (const Q4Matrix* m : {&L.w_gate_up_q4, &L.w_down_q4}) {
        q4 += !m->empty();
        ++total;
      }
    }
    for (const auto& X : L.experts)
      for (const Q4Matrix* m : {&X.gate_up_q4, &X.down_q4}) {
        q4 += !m->empty();
        ++total;
      }
  }
  return q4 == 0 ? "bf16" : q4 == total ? "int4" : "mixed";
}

size_t Model::set_bytes(int i) const {
  const ModelWeights& w = sets_[size_t(i)];
  size_t n = w.embed.packed.size() * 2 + w.output.packed.size() * 2 + w.output_q4.bytes();
  for (const auto& L : w.layers) {
    for (const Matrix* m : {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down}) n += m->packed.size() * 2;
    for (const Q4Matrix* m : {&L.wqkv_q4, &L.wo_q4, &L.w_gate_up_q4, &L.w_down_q4}) n += m->bytes();
    n += L.router.packed.size() * 2;
    n += L.wq_b.packed.size() * 2 + L.wq_b_q4.bytes() + L.wkv_b.packed.size() * 2;
    for (const auto* v : {&L.w_uk_t, &L.w_uv})
      for (const Matrix& m : *v) n += m.packed.size() * 2;
    for (const auto& X : L.experts)
      n += X.gate_up.packed.size() * 2 + X.down.packed.size() * 2 + X.gate_up_q4.bytes() +
           X.down_q4.bytes();
  }
  return n;
}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const WeightOptions& opts) {
  // Resolve kNative to the checkpoint's form, then load each distinct form once.
  const WeightPrecision native =
      checkpoint_is_int4(path) ? WeightPrecision::kInt4 : WeightPrecision::kBf16;
  auto resolve = [&](WeightPrecision p) { return p == WeightPrecision::kNative ? native : p; };
  const WeightPrecision want[2] = {resolve(opts.prefill), resolve(opts.decode)};
  ModelConfig cfg;
  std::vector<ModelWeights> sets;
  std::vector<WeightPrecision> loaded;
  int index[2] = {0, 0};
  for (int phase = 0; phase < 2; ++phase) {
    auto at = std::find(loaded.begin(), loaded.end(), want[phase]);
    if (at != loaded.end()) {
      index[phase] = int(at - loaded.begin());
      continue;
    }
    WeightSetOptions so;
    so.precision = want[phase];
    so.int4_group = opts.int4_group;
    so.int4_lm_head = opts.int4_lm_head;
    auto m = load_model(path, so);
    if (!m) return m.error();
    cfg = std::move(m->config);
    index[phase] = int(sets.size());
    sets.push_back(std::move(m->weights));
    loaded.push_back(want[phase]);
  }
  return std::make_unique<Model>(std::move(cfg), std::move(sets), index[0], index[1]);
}

void Model::ensure_workspace(int64_t T, int64_t ctx, int64_t max_pages, int64_t gather_rows) {
  auto& ws = *ws_;
  if (T > ws.tokens) {
    const auto& c = cfg_;
    const int64_t mla_first = c.mla() ? c.mla_first_width() : 0;
    const int64_t qkv = std::max(c.q_dim() + 2 * c.kv_dim(), mla_first);
    const int64_t widest = std::max({c.hidden, c.q_dim(), c.ffn, c.moe_ffn, c.moe_shared_ffn,
                                     c.heads * c.v_head_dim, c.q_lora_rank, c.kv_lora_rank});
    ws.x = AlignedBuffer<float>(size_t(T * c.hidden));
    ws.h = AlignedBuffer<float>(size_t(T * c.hidden));
    ws.out = AlignedBuffer<float>(size_t(T * c.hidden));
    ws.qkv = AlignedBuffer<float>(size_t(T * qkv));
    ws.attn = AlignedBuffer<float>(size_t(T * std::max(c.q_dim(), c.heads * c.v_head_dim)));
    if (c.mla()) {
      const int64_t H = c.heads, D = c.cache_dim();
      ws.mq = AlignedBuffer<float>(size_t(T * c.q_dim()));
      ws.lat = AlignedBuffer<float>(size_t(T * D));
      ws.mdq = AlignedBuffer<float>(size_t(T * H * c.qk_nope_dim));
      ws.mql = AlignedBuffer<float>(size_t(T * H * D));
      ws.mol = AlignedBuffer<float>(size_t(T * H * D));
      ws.mdv = AlignedBuffer<float>(size_t(T * H * c.v_head_dim));
      if (ws.mexp.size() == 0) {
        ws.mexp_in = AlignedBuffer<float>(size_t(kExpandRows * c.kv_lora_rank));
        ws.mxb = AlignedBuffer<uint16_t>(size_t(kExpandRows * c.kv_lora_rank));
        ws.mexp = AlignedBuffer<float>(size_t(kExpandRows * H * (c.qk_nope_dim + c.v_head_dim)));
      }
    }
    ws.gu = AlignedBuffer<float>(size_t(T * 2 * c.ffn));
    ws.act = AlignedBuffer<float>(size_t(T * c.ffn));
    ws.xb = AlignedBuffer<uint16_t>(size_t(T * widest));
    if (c.n_experts > 0) {
      // Rows: T * k routed pairs, or T for the shared experts, whichever is more.
      const int64_t Tk = T * std::max<int64_t>(c.moe_top_k, 1);
      const int64_t Fw = std::max(c.moe_ffn, c.moe_shared_ffn);
      ws.moe_logits = AlignedBuffer<float>(size_t(T * c.n_experts));
      ws.moe_w = AlignedBuffer<float>(size_t(Tk));
      ws.moe_x = AlignedBuffer<float>(size_t(Tk * c.hidden));
      ws.moe_gu = AlignedBuffer<float>(size_t(Tk * 2 * Fw));
      ws.moe_act = AlignedBuffer<float>(size_t(Tk * Fw));
      ws.moe_y = AlignedBuffer<float>(size_t(Tk * c.hidden));
      ws.moe_scratch = AlignedBuffer<float>(size_t(2 * c.n_experts + c.moe_n_group + 1));
      ws.moe_ids.resize(size_t(Tk));
      ws.moe_slot.resize(size_t(Tk));
    }
    const size_t half = size_t(T * c.head_dim / 2);
    ws.cos_g = AlignedBuffer<float>(half);
    ws.sin_g = AlignedBuffer<float>(half);
    ws.cos_l = AlignedBuffer<float>(half);
    ws.sin_l = AlignedBuffer<float>(half);
    ws.tokens = T;
  }
  if (ctx > ws.ctx) {
    const int64_t group = cfg_.mla() ? 8 : cfg_.heads / cfg_.kv_heads;
    ws.scores = AlignedBuffer<float>(
        size_t(num_threads() * std::max<int64_t>(group, kPrefillQueries) * ctx));
    ws.ctx = ctx;
  }
  if (max_pages > ws.max_pages) {
    ws.ptrs = AlignedBuffer<const uint8_t*>(size_t(num_threads() * 4 * max_pages));
    ws.max_pages = max_pages;
  }
  if (gather_rows > ws.gather_rows) {
    if (cfg_.mla()) {
      ws.gk = AlignedBuffer<uint16_t>(size_t(gather_rows * cfg_.cache_dim()));
      ws.ek = AlignedBuffer<uint16_t>(size_t(gather_rows * cfg_.q_dim()));
      ws.ev = AlignedBuffer<uint16_t>(size_t(gather_rows * cfg_.heads * cfg_.v_head_dim));
    } else {
      ws.gk = AlignedBuffer<uint16_t>(size_t(gather_rows * cfg_.kv_dim()));
      ws.gv = AlignedBuffer<uint16_t>(size_t(gather_rows * cfg_.kv_dim()));
    }
    ws.gather_rows = gather_rows;
  }
}

void Model::rope_tables(const Batch& b, int64_t T) {
  const int64_t h = cfg_.head_dim / 2;
  auto& ws = *ws_;
  int64_t t = 0;
  for (auto& s : b.seqs) {
    for (int64_t i = 0; i < s.n_tokens; ++i, ++t) {
      const float pos = float(s.pos0 + i);
      for (int64_t j = 0; j < cfg_.rope_dim() / 2; ++j) {  // rows keep the head_dim/2 stride
        const float ag = pos * inv_freq_[size_t(j)];
        const float al = pos * inv_freq_local_[size_t(j)];
        const float fg = cfg_.rope.attn_factor, fl = cfg_.rope_local.attn_factor;
        ws.cos_g[size_t(t * h + j)] = std::cos(ag) * fg;
        ws.sin_g[size_t(t * h + j)] = std::sin(ag) * fg;
        ws.cos_l[size_t(t * h + j)] = std::cos(al) * fl;
        ws.sin_l[size_t(t * h + j)] = std::sin(al) * fl;
      }
    }
  }
  KV_CHECK_EQ(t, T);
}

Result<void> Model::forward(const Batch& b, std::span<float> logits) {
  const auto& c = cfg_;
  const int64_t T = int64_t(b.tokens.size());
  int64_t total = 0, max_ctx = 0, max_pages = 0, gather_rows = 0;
  ws_->gather_off.assign(b.seqs.size(), -1);
  ws_->gather_j0.assign(b.seqs.size(), 0);
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const auto& s = b.seqs[si];
    if (!s.kv || !s.kv->format || s.n_tokens <= 0)
      return make_error("forward: empty sequence chunk");
    if (s.all_logits && (s.logit_skip < 0 || s.logit_skip >= s.n_tokens))
      return make_error("forward: logit_skip must leave at least one row of the chunk");
    const KvFormat& f = *s.kv->format;
    if (f.kv_heads != c.cache_heads() || f.head_dim != c.cache_dim())
      return make_error("forward: the KV pages have " + std::to_string(f.kv_heads) + " heads of " +
                        std::to_string(f.head_dim) + ", the model " + std::to_string(c.cache_heads()) +
                        " of " + std::to_string(c.cache_dim()));
    if (c.mla() && f.v_offset != f.k_offset)
      return make_error("forward: latent-attention KV pages must share K and V (one row per token)");
    if (c.index_topk > 0 && f.index_dim != c.index_head_dim)
      return make_error("forward: the KV pages carry no sparse-attention indexer keys");
    if (f.elem != kernels::KvElem::kBf16 && !f.dynamic_scales &&
        (int64_t(f.static_k.size()) != c.layers * c.cache_heads() ||
         int64_t(f.static_v.size()) != c.layers * c.cache_heads()))
      return make_error("forward: static FP8 KV needs one K and one V scale per layer and KV head");
    if (s.pos0 < 0 || s.pos0 + s.n_tokens > s.kv->capacity())
      return make_error("forward: positions [" + std::to_string(s.pos0) + ", " +
                        std::to_string(s.pos0 + s.n_tokens) +
                        ") exceed the sequence's KV capacity " + std::to_string(s.kv->capacity()));
    total += s.n_tokens;
    const int64_t end = s.pos0 + s.n_tokens;
    max_ctx = std::max(max_ctx, end);
    max_pages = std::max(max_pages, s.kv->n_pages);
    if (!decodes_paged_impl(c, s)) {
      // Rows [j0, end) in BF16: the earliest query's window start onwards.
      const int64_t j0 = c.sliding_window > 0 && !c.sliding.empty()
                             ? std::max<int64_t>(0, s.pos0 - c.sliding_window + 1)
                             : 0;
      // Full-attention layers need every row even when sliding ones do not.
      const bool any_full = std::find(c.sliding.begin(), c.sliding.end(), 0) != c.sliding.end() ||
                            c.sliding.empty() || c.sliding_window <= 0;
      const int64_t g0 = any_full ? 0 : j0;
      ws_->gather_off[si] = gather_rows;
      ws_->gather_j0[si] = g0;
      gather_rows += end - g0;
    }
  }
  if (total != T) return make_error("forward: token count does not match the chunks");
  for (int32_t tok : b.tokens)
    if (tok < 0 || tok >= c.vocab)
      return make_error("forward: token id " + std::to_string(tok) +
                        " outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  if (int64_t(logits.size()) < b.logit_rows() * c.vocab)
    return make_error("forward: logits buffer too small");

  ensure_workspace(T, max_ctx, std::max(max_pages, max_ctx), gather_rows);
  auto& ws = *ws_;
  // Embedding lookup (BF16 rows -> FP32), scaled for Gemma.
  // Row segments by weight set: one-token chunks decode, longer ones prefill.
  segs_.clear();
  logit_segs_.clear();
  {
    int64_t t = 0, r = 0;
    auto push = [](std::vector<RowSegment>& v, int64_t a, int64_t e, int set) {
      if (!v.empty() && v.back().set == set && v.back().t1 == a)
        v.back().t1 = e;
      else
        v.push_back({a, e, set});
    };
    for (auto& s : b.seqs) {
      const int set = s.n_tokens == 1 ? decode_set_ : prefill_set_;
      push(segs_, t, t + s.n_tokens, set);
      const int64_t nl = s.logit_count();
      push(logit_segs_, r, r + nl, set);
      t += s.n_tokens;
      r += nl;
    }
  }
  for (const auto& sg : segs_)
    for (int64_t t = sg.t0; t < sg.t1; ++t)
      sets_[size_t(sg.set)].embed.row_f32(b.tokens[size_t(t)], c.embed_scale,
                                          ws.x.data() + t * c.hidden);
  ws.items.clear();
  {
    int64_t t = 0;
    for (auto& s : b.seqs)
      for (int64_t i = 0; i < s.n_tokens; ++i) ws.items.push_back({&s, t++, i});
  }
  rope_tables(b, T);
  for (int64_t l = 0; l < c.layers; ++l) layer_forward(l, b, T);

  // Final norm and logits for the rows that want them (each row with its
  // chunk's weight set).
  int64_t r = 0, t0 = 0;
  for (auto& s : b.seqs) {
    const int set = s.n_tokens == 1 ? decode_set_ : prefill_set_;
    const int64_t first = s.all_logits ? t0 + s.logit_skip : t0 + s.n_tokens - 1;
    for (int64_t t = first; t < t0 + s.n_tokens; ++t, ++r) {
      ops::rmsnorm(ws.x.data() + t * c.hidden, sets_[size_t(set)].out_norm.data(), c.rms_eps,
                   ws.h.data() + r * c.hidden, c.hidden);
    }
    t0 += s.n_tokens;
  }
  for (const auto& sg : logit_segs_) {
    const ModelWeights& W = sets_[size_t(sg.set)];
    const Q4Matrix& head4 = W.output_q4;
    ops::linear(ws.h.data() + sg.t0 * c.hidden, c.hidden, W.lm_head(), head4,
                logits.data() + sg.t0 * c.vocab, c.vocab, sg.t1 - sg.t0, ws.xb.data(), ws.q8);
  }
  if (c.final_softcap > 0.f) {
    for (int64_t i = 0; i < r * c.vocab; ++i)
      logits[size_t(i)] = std::tanh(logits[size_t(i)] / c.final_softcap) * c.final_softcap;
  }
  return {};
}

// Product `which` (0 qkv, 1 o, 2 gate|up, 3 down) of layer l for every
// row, each row segment through its weight set.
void Model::linear(int64_t l, int which, const float* x, int64_t ldx, float* y, int64_t ldy) {
  auto& ws = *ws_;
  if (observer_ && !segs_.empty()) observer_(l, which, x, ldx, segs_.back().t1);
  for (const auto& sg : segs_) {
    const LayerWeights& L = sets_[size_t(sg.set)].layers[size_t(l)];
    const Matrix* W[] = {&L.wqkv, &L.wo, &L.w_gate_up, &L.w_down};
    const Q4Matrix* W4[] = {&L.wqkv_q4, &L.wo_q4, &L.w_gate_up_q4, &L.w_down_q4};
    ops::linear(x + sg.t0 * ldx, ldx, *W[which], *W4[which], y + sg.t0 * ldy, ldy, sg.t1 - sg.t0,
                ws.xb.data(), ws.q8);
  }
}

// The routed MLP of layer l on ws.h (normed rows) into ws.out, grouped by
// expert: each expert's tokens are gathered into consecutive rows and go
// through its products together, then every token sums its experts' outputs
// in ascending expert order (so a token's result does not depend on the
// batch). Each row segment uses its weight set's experts.
void Model::moe_forward(int64_t l) {
  const auto& c = cfg_;
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t H = c.hidden, F = c.moe_ffn, E = c.n_experts, k = c.moe_top_k;
  static const Q4Matrix kNoQ4;
  const RouterConfig rc{c.moe_sigmoid ? RouterScoring::kSigmoid : RouterScoring::kSoftmax,
                        int(E), int(k), int(c.moe_n_group), int(c.moe_topk_group),
                        c.moe_norm_topk, c.moe_scaling};
  for (const auto& sg : segs_) {
    const LayerWeights& L = sets_[size_t(sg.set)].layers[size_t(l)];
    const int64_t n = sg.t1 - sg.t0;
    const float* h = ws.h.data() + sg.t0 * H;
    ops::linear(h, H, L.router, kNoQ4, ws.moe_logits.data(), E, n, ws.xb.data(), ws.q8);
    route_tokens(rc, ws.moe_logits.data(), L.router_bias.empty() ? nullptr : L.router_bias.data(), n,
                 ws.moe_ids.data(), ws.moe_w.data(), ws.moe_scratch.data());
    // Counting sort of the (token, choice) pairs by expert.
    ws.moe_count.assign(size_t(E + 1), 0);
    for (int64_t i = 0; i < n * k; ++i) ++ws.moe_count[size_t(ws.moe_ids[size_t(i)]) + 1];
    for (int64_t e = 0; e < E; ++e) ws.moe_count[size_t(e + 1)] += ws.moe_count[size_t(e)];
    std::vector<int64_t>& next = ws.moe_slot;  // reused: slot of pair i
    {
      ws.moe_fill.assign(ws.moe_count.begin(), ws.moe_count.end() - 1);
      for (int64_t i = 0; i < n * k; ++i) {
        const int64_t row = ws.moe_fill[size_t(ws.moe_ids[size_t(i)])]++;
        next[size_t(i)] = row;
        std::memcpy(ws.moe_x.data() + row * H, h + (i / k) * H, size_t(H) * sizeof(float));
      }
    }
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = ws.moe_count[size_t(e)], m = ws.moe_count[size_t(e + 1)] - r0;
      if (m == 0) continue;
      const ExpertWeights& X = L.experts[size_t(e)];
      ops::linear(ws.moe_x.data() + r0 * H, H, X.gate_up, X.gate_up_q4,
                  ws.moe_gu.data() + r0 * 2 * F, 2 * F, m, ws.xb.data(), ws.q8);
      for (int64_t r = r0; r < r0 + m; ++r) {
        const float* g = ws.moe_gu.data() + r * 2 * F;
        float* a = ws.moe_act.data() + r * F;
        if (c.act == Activation::GeluTanh)
          K.gelu_tanh_mul(g, g + F, a, F);
        else
          K.silu_mul(g, g + F, a, F);
      }
      ops::linear(ws.moe_act.data() + r0 * F, F, X.down, X.down_q4, ws.moe_y.data() + r0 * H, H, m,
                  ws.xb.data(), ws.q8);
    }
    for (int64_t t = 0; t < n; ++t) {
      float* o = ws.out.data() + (sg.t0 + t) * H;
      std::fill(o, o + H, 0.f);
      for (int64_t j = 0; j < k; ++j) {  // route_tokens lists experts in ascending order
        const float w = ws.moe_w[size_t(t * k + j)];
        const float* y = ws.moe_y.data() + next[size_t(t * k + j)] * H;
        for (int64_t d = 0; d < H; ++d) o[d] = std::fma(w, y[d], o[d]);
      }
    }
    // Shared experts see every token; added after the routed sum.
    if (c.moe_shared_ffn > 0) {
      const int64_t S = c.moe_shared_ffn;
      ops::linear(h, H, L.shared.gate_up, L.shared.gate_up_q4, ws.moe_gu.data(), 2 * S, n,
                  ws.xb.data(), ws.q8);
      for (int64_t t = 0; t < n; ++t) {
        const float* g = ws.moe_gu.data() + t * 2 * S;
        K.silu_mul(g, g + S, ws.moe_act.data() + t * S, S);
      }
      ops::linear(ws.moe_act.data(), S, L.shared.down, L.shared.down_q4, ws.moe_y.data(), H, n,
                  ws.xb.data(), ws.q8);
      for (int64_t t = 0; t < n; ++t) {
        float* o = ws.out.data() + (sg.t0 + t) * H;
        const float* y = ws.moe_y.data() + t * H;
        for (int64_t d = 0; d < H; ++d) o[d] += y[d];
      }
    }
  }
}

void Model::layer_forward(int64_t l, const Batch& b, int64_t T) {
  const auto& c = cfg_;
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t H = c.hidden, qkv_n = c.q_dim() + 2 * c.kv_dim();
  auto layer_of = [&](int64_t t) -> const LayerWeights& {
    for (const auto& sg : segs_)
      if (t < sg.t1) return sets_[size_t(sg.set)].layers[size_t(l)];
    return sets_[0].layers[size_t(l)];
  };

  // Attention block.
  for (int64_t t = 0; t < T; ++t)
    ops::rmsnorm(ws.x.data() + t * H, layer_of(t).attn_norm.data(), c.rms_eps, ws.h.data() + t * H, H);
  if (c.mla()) {
    linear(l, 0, ws.h.data(), H, ws.qkv.data(), c.mla_first_width(l));
    mla_attention(l, b, T);
    linear(l, 1, ws.attn.data(), c.heads * c.v_head_dim, ws.out.data(), H);
  } else {
    linear(l, 0, ws.h.data(), H, ws.qkv.data(), qkv_n);
    attention(l, b, T);
    linear(l, 1, ws.attn.data(), c.q_dim(), ws.out.data(), H);
  }
  for (int64_t t = 0; t < T; ++t) {
    const auto& L = layer_of(t);
    float* o = ws.out.data() + t * H;
    if (!L.post_attn_norm.empty()) ops::rmsnorm(o, L.post_attn_norm.data(), c.rms_eps, o, H);
    float* x = ws.x.data() + t * H;
    for (int64_t i = 0; i < H; ++i) x[i] += o[i];
  }

  // MLP block.
  for (int64_t t = 0; t < T; ++t)
    ops::rmsnorm(ws.x.data() + t * H, layer_of(t).ffn_norm.data(), c.rms_eps, ws.h.data() + t * H, H);
  if (!c.moe_layer.empty() && c.moe_layer[size_t(l)]) {
    moe_forward(l);
  } else {
    linear(l, 2, ws.h.data(), H, ws.gu.data(), 2 * c.ffn);
    for (int64_t t = 0; t < T; ++t) {
      const float* g = ws.gu.data() + t * 2 * c.ffn;
      float* a = ws.act.data() + t * c.ffn;
      if (c.act == Activation::GeluTanh)
        K.gelu_tanh_mul(g, g + c.ffn, a, c.ffn);
      else
        K.silu_mul(g, g + c.ffn, a, c.ffn);
    }
    linear(l, 3, ws.act.data(), c.ffn, ws.out.data(), H);
  }
  for (int64_t t = 0; t < T; ++t) {
    const auto& L = layer_of(t);
    float* o = ws.out.data() + t * H;
    if (!L.post_ffn_norm.empty()) ops::rmsnorm(o, L.post_ffn_norm.data(), c.rms_eps, o, H);
    float* x = ws.x.data() + t * H;
    for (int64_t i = 0; i < H; ++i) x[i] += o[i];
  }
}

// Bias, QK-norm and RoPE on the fresh q/k rows, then each token's K/V rows
// into its page slot in the page dtype.
void Model::store_kv(int64_t l, const Batch& b, int64_t T) {
  const auto& c = cfg_;
  // Biases and QK-norms are the same in every weight set.
  const auto& L = sets_[0].layers[size_t(l)];
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), qkv_n = qd + 2 * kvd;
  const bool sliding = c.sliding[size_t(l)] && c.sliding_window > 0;
  const float* cosb = sliding ? ws.cos_l.data() : ws.cos_g.data();
  const float* sinb = sliding ? ws.sin_l.data() : ws.sin_g.data();
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const TokenRef& it = ws.items[size_t(t)];
      float* row = ws.qkv.data() + t * qkv_n;
      if (!L.bqkv.empty())
        for (int64_t j = 0; j < qkv_n; ++j) row[j] += L.bqkv[size_t(j)];
      for (int64_t h = 0; h < c.heads + c.kv_heads; ++h) {
        float* x = row + h * hd;
        if (c.qk_norm)
          ops::rmsnorm(x, h < c.heads ? L.q_norm.data() : L.k_norm.data(), c.rms_eps, x, hd);
        ops::rope(x, cosb + t * hd / 2, sinb + t * hd / 2, c.rope_dim());
      }
      const KvFormat& f = *it.s->kv->format;
      const int64_t pos = it.s->pos0 + it.i;
      uint8_t* page = it.s->kv->pages[pos / f.page_tokens] + l * f.layer_bytes;
      const int64_t slot = pos % f.page_tokens;
      const float* kr = row + qd;
      const float* vr = row + qd + kvd;
      if (f.elem == kernels::KvElem::kBf16) {
        K.f32_to_bf16(kr, reinterpret_cast<uint16_t*>(page + f.k_offset + slot * f.row_bytes()),
                      kvd);
        K.f32_to_bf16(vr, reinterpret_cast<uint16_t*>(page + f.v_offset + slot * f.row_bytes()),
                      kvd);
        continue;
      }
      uint8_t* kd = page + f.k_offset + slot * f.row_bytes();
      uint8_t* vd = page + f.v_offset + slot * f.row_bytes();
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        float ks, vs;
        if (f.dynamic_scales) {
          ks = kv_row_scale(f.elem, kr + h * hd, hd);
          vs = kv_row_scale(f.elem, vr + h * hd, hd);
          // Exact: kv_row_scale returns BF16 values.
          reinterpret_cast<uint16_t*>(page + f.k_scale_offset)[slot * c.kv_heads + h] =
              f32_to_bf16(ks);
          reinterpret_cast<uint16_t*>(page + f.v_scale_offset)[slot * c.kv_heads + h] =
              f32_to_bf16(vs);
        } else {
          ks = f.static_k[size_t(l * c.kv_heads + h)];
          vs = f.static_v[size_t(l * c.kv_heads + h)];
        }
        kv_store_row(f.elem, kr + h * hd, hd, ks, kd + h * hd);
        kv_store_row(f.elem, vr + h * hd, hd, vs, vd + h * hd);
      }
    }
  });
}

// BF16 rows for prefill attention: earlier positions decoded from the pages,
// the chunk's own positions from the fresh FP32 rows (so FP8 pages do not
// round-trip the chunk's own K/V; with BF16 pages both give the same bits).
void Model::gather_kv(int64_t l, const Batch& b) {
  const auto& c = cfg_;
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), qkv_n = qd + 2 * kvd;
  // One task per (chunk, page) of rows to gather.
  std::vector<GatherPiece>& pieces = gather_pieces_;
  pieces.clear();
  int64_t t_base = 0;
  std::vector<int64_t>& chunk_t0 = chunk_t0_;
  chunk_t0.assign(b.seqs.size(), 0);
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    const auto& s = b.seqs[si];
    chunk_t0[si] = t_base;
    t_base += s.n_tokens;
    if (ws.gather_off[si] < 0) continue;
    const int64_t pt = s.kv->format->page_tokens;
    for (int64_t j = ws.gather_j0[si]; j < s.pos0 + s.n_tokens;) {
      const int64_t e = std::min((j / pt + 1) * pt, s.pos0 + s.n_tokens);
      pieces.push_back({int64_t(si), j, e});
      j = e;
    }
  }
  parallel_for(int64_t(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
    float tmp[2 * 1024];
    for (int64_t p = p0; p < p1; ++p) {
      const GatherPiece& pc = pieces[size_t(p)];
      const auto& s = b.seqs[size_t(pc.seq)];
      const KvFormat& f = *s.kv->format;
      for (int64_t j = pc.j0; j < pc.j1; ++j) {
        uint16_t* gk =
            ws.gk.data() + (ws.gather_off[size_t(pc.seq)] + j - ws.gather_j0[size_t(pc.seq)]) * kvd;
        uint16_t* gv = ws.gv.data() + (gk - ws.gk.data());
        if (j >= s.pos0) {
          const float* row = ws.qkv.data() + (chunk_t0[size_t(pc.seq)] + j - s.pos0) * qkv_n;
          K.f32_to_bf16(row + qd, gk, kvd);
          K.f32_to_bf16(row + qd + kvd, gv, kvd);
          continue;
        }
        const uint8_t* page = s.kv->pages[j / f.page_tokens] + l * f.layer_bytes;
        const int64_t slot = j % f.page_tokens;
        const uint8_t* kd = page + f.k_offset + slot * f.row_bytes();
        const uint8_t* vd = page + f.v_offset + slot * f.row_bytes();
        if (f.elem == kernels::KvElem::kBf16) {
          std::memcpy(gk, kd, size_t(kvd) * 2);
          std::memcpy(gv, vd, size_t(kvd) * 2);
          continue;
        }
        const float* table =
            f.elem == kernels::KvElem::kFp8E4m3 ? fp8_e4m3_table() : fp8_e5m2_table();
        for (int64_t h = 0; h < c.kv_heads; ++h) {
          float ks, vs;
          if (f.dynamic_scales) {
            ks = bf16_to_f32(
                reinterpret_cast<const uint16_t*>(page + f.k_scale_offset)[slot * c.kv_heads + h]);
            vs = bf16_to_f32(
                reinterpret_cast<const uint16_t*>(page + f.v_scale_offset)[slot * c.kv_heads + h]);
          } else {
            ks = f.static_k[size_t(l * c.kv_heads + h)];
            vs = f.static_v[size_t(l * c.kv_heads + h)];
          }
          for (int64_t d = 0; d < hd; ++d) {
            tmp[d] = table[kd[h * hd + d]] * ks;
            tmp[hd + d] = table[vd[h * hd + d]] * vs;
          }
          K.f32_to_bf16(tmp, gk + h * hd, hd);
          K.f32_to_bf16(tmp + hd, gv + h * hd, hd);
        }
      }
    }
  });
}

void Model::attention(int64_t l, const Batch& b, int64_t T) {
  const auto& c = cfg_;
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), qkv_n = qd + 2 * kvd;
  const bool sliding = c.sliding[size_t(l)] && c.sliding_window > 0;
  const int64_t group = c.heads / c.kv_heads;

  store_kv(l, b, T);
  gather_kv(l, b);

  // Work items: decode chunks per (chunk, KV head) through the pages, prefill
  // tokens per (token, query head) over the gathered rows.
  auto& dec = ws.decode_tasks;
  auto& pre = ws.prefill_tasks;
  dec.clear();
  pre.clear();
  {
    int64_t t = 0;
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      const auto& s = b.seqs[si];
      if (ws.gather_off[si] < 0) {
        for (int64_t h = 0; h < c.kv_heads; ++h) dec.push_back({int64_t(si), h, 0});
      } else {
        // Head-major: consecutive tasks read the same KV head's rows, so a
        // thread's working set is one head's K and V (L2-sized at 4k tokens).
        for (int64_t h = 0; h < c.heads; ++h)
          for (int64_t i = 0; i < s.n_tokens; i += kPrefillQueries)
            pre.push_back({int64_t(si), t + i, h, std::min(kPrefillQueries, s.n_tokens - i)});
      }
      t += s.n_tokens;
    }
  }
  std::vector<int64_t>& chunk_t0 = chunk_t0_;
  const int64_t n_dec = int64_t(dec.size()), n_all = n_dec + int64_t(pre.size());
  const int nt = num_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_all > 1 && nt > 1)
  for (int64_t w = 0; w < n_all; ++w) {
    const int tid = omp_get_thread_num();
    float* sc =
        ws.scores.data() + int64_t(tid) * std::max<int64_t>(group, kPrefillQueries) * ws.ctx;
    if (w < n_dec) {
      const auto& task = dec[size_t(w)];
      const auto& s = b.seqs[size_t(task.seq)];
      const KvFormat& f = *s.kv->format;
      const int64_t kvh = task.a;
      const int64_t pos = s.pos0;  // the single token's position
      const int64_t j0 = sliding ? std::max<int64_t>(0, pos - c.sliding_window + 1) : 0;
      const int64_t n = pos - j0 + 1;
      const int64_t eb = f.elem_bytes();
      const uint8_t** kp = ws.ptrs.data() + int64_t(tid) * 4 * ws.max_pages;
      const uint8_t** vp = kp + ws.max_pages;
      const uint16_t** ksp = reinterpret_cast<const uint16_t**>(vp + ws.max_pages);
      const uint16_t** vsp = ksp + ws.max_pages;
      kernels::PagedKv kv;
      kv.elem = f.elem;
      kv.n_tokens = n;
      kv.scale_stride = c.kv_heads;
      if (!f.dynamic_scales && f.elem != kernels::KvElem::kBf16) {
        kv.k_scale = f.static_k[size_t(l * c.kv_heads + kvh)];
        kv.v_scale = f.static_v[size_t(l * c.kv_heads + kvh)];
      }
      // Page-aligned start: one pointer per page; a window starting inside a
      // page: one pointer per token (page_tokens = 1).
      const bool per_token = j0 % f.page_tokens != 0;
      kv.page_tokens = per_token ? 1 : f.page_tokens;
      kv.token_stride = f.row_bytes();
      const int64_t np = per_token ? n : (n + f.page_tokens - 1) / f.page_tokens;
      for (int64_t p = 0; p < np; ++p) {
        const int64_t j = per_token ? j0 + p : j0 + p * f.page_tokens;
        const uint8_t* page = s.kv->pages[j / f.page_tokens] + l * f.layer_bytes;
        const int64_t slot = j % f.page_tokens;
        kp[p] = page + f.k_offset + slot * f.row_bytes() + kvh * hd * eb;
        vp[p] = page + f.v_offset + slot * f.row_bytes() + kvh * hd * eb;
        if (f.dynamic_scales) {
          ksp[p] =
              reinterpret_cast<const uint16_t*>(page + f.k_scale_offset) + slot * c.kv_heads + kvh;
          vsp[p] =
              reinterpret_cast<const uint16_t*>(page + f.v_scale_offset) + slot * c.kv_heads + kvh;
        }
      }
      kv.k_pages = kp;
      kv.v_pages = vp;
      if (f.dynamic_scales) {
        kv.k_scales = ksp;
        kv.v_scales = vsp;
      }
      const int64_t t = chunk_t0[size_t(task.seq)];
      const float* q = ws.qkv.data() + t * qkv_n + kvh * group * hd;
      K.paged_attn_decode(q, group, hd, c.attn_scale, kv, sc,
                          ws.attn.data() + t * qd + kvh * group * hd);
      continue;
    }
    // Prefill: causal (optionally windowed) softmax attention of task.n
    // consecutive tokens of one head. Each token's result is bitwise what it
    // gets alone (attn_*_multi's contract), so chunking does not change it.
    const auto& task = pre[size_t(w - n_dec)];
    const int64_t h = task.b, kvh = h / group;
    const int64_t g0 = ws.gather_off[size_t(task.seq)] - ws.gather_j0[size_t(task.seq)];
    const uint16_t* kbase = ws.gk.data() + kvh * hd;
    const uint16_t* vbase = ws.gv.data() + kvh * hd;
    int64_t j0s[kPrefillQueries], ns[kPrefillQueries];
    bool same_start = true;
    for (int64_t i = 0; i < task.n; ++i) {
      const TokenRef& it = ws.items[size_t(task.a + i)];
      const int64_t pos = it.s->pos0 + it.i;
      j0s[i] = sliding ? std::max<int64_t>(0, pos - c.sliding_window + 1) : 0;
      ns[i] = pos - j0s[i] + 1;
      same_start = same_start && j0s[i] == j0s[0];
    }
    const TokenRef& first = ws.items[size_t(task.a)];
    const float* q0 = ws.qkv.data() + first.t * qkv_n + h * hd;
    float* o0 = ws.attn.data() + first.t * qd + h * hd;
    if (task.n > 1 && same_start && K.attn_scores_multi && K.attn_weighted_sum_multi) {
      const int64_t row0 = g0 + j0s[0];
      const int64_t n_max = ns[task.n - 1];  // tokens are consecutive: the last sees the most rows
      K.attn_scores_multi(q0, qkv_n, task.n, kbase + row0 * kvd, kvd, n_max, hd, c.attn_scale, sc,
                          n_max);
      for (int64_t i = 0; i < task.n; ++i) {
        float* si = sc + i * n_max;
        if (c.attn_softcap > 0.f)
          for (int64_t j = 0; j < ns[i]; ++j)
            si[j] = std::tanh(si[j] / c.attn_softcap) * c.attn_softcap;
        K.softmax(si, ns[i]);
      }
      K.attn_weighted_sum_multi(sc, n_max, ns, task.n, vbase + row0 * kvd, kvd, hd, o0, qd);
      continue;
    }
    for (int64_t i = 0; i < task.n; ++i) {
      const int64_t row0 = g0 + j0s[i];
      const float* q = q0 + i * qkv_n;
      K.attn_scores(q, kbase + row0 * kvd, kvd, ns[i], hd, c.attn_scale, sc);
      if (c.attn_softcap > 0.f)
        for (int64_t j = 0; j < ns[i]; ++j)
          sc[j] = std::tanh(sc[j] / c.attn_softcap) * c.attn_softcap;
      K.softmax(sc, ns[i]);
      K.attn_weighted_sum(sc, vbase + row0 * kvd, kvd, ns[i], hd, o0 + i * qd);
    }
  }
}

// Multi-head latent attention (DeepSeek-V3). Each token caches one row per
// layer, the normed latent c (kv_lora_rank) and the roped shared key k_pe,
// in the page dtype with one scale for the whole row. Decode absorbs the
// up-projections: head h's query becomes [W_uk_h^T q_nope_h, q_pe_h], so it
// attends over the cached rows as a single KV head of width D (the row is
// K and V at once), and its output is W_uv_h applied to the attended latent.
// Prefill expands the rows it attends over into per-head K = [W_uk_h c, k_pe]
// and V = W_uv_h c (BF16) and runs the usual causal attention.
void Model::mla_attention(int64_t l, const Batch& b, int64_t T) {
  const auto& c = cfg_;
  const auto& K = kernels::active();
  auto& ws = *ws_;
  static const Q4Matrix kNoQ4;
  const int64_t H = c.heads, qk = c.head_dim, nope = c.qk_nope_dim, dr = c.qk_rope_dim,
                R = c.kv_lora_rank, D = R + dr, dv = c.v_head_dim, hh = c.head_dim / 2;
  const int64_t qa = c.q_lora_rank > 0 ? c.q_lora_rank : H * qk;
  const int64_t ldx = c.mla_first_width(l);
  const LayerWeights& L0 = sets_[0].layers[size_t(l)];  // norms: the same in every set
  constexpr float kLatentEps = 1e-6f;  // q_a / kv_a norms use the RMSNorm default, not rms_norm_eps
  const bool il = c.rope_interleave;

  // Latent rows (normed c | roped k_pe) and the normed q_a.
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = ws.qkv.data() + t * ldx;
      if (c.q_lora_rank > 0) ops::rmsnorm(row, L0.q_a_norm.data(), kLatentEps, row, qa);
      float* lat = ws.lat.data() + t * D;
      ops::rmsnorm(row + qa, L0.kv_a_norm.data(), kLatentEps, lat, R);
      std::memcpy(lat + R, row + qa + R, size_t(dr) * sizeof(float));
      rope_rows(lat + R, ws.cos_g.data() + t * hh, ws.sin_g.data() + t * hh, dr, il);
    }
  });
  // Queries [T, H*qk] (q_b of the normed q_a, or q_proj's rows directly).
  float* q = ws.qkv.data();
  int64_t ldq = ldx;
  if (c.q_lora_rank > 0) {
    for (const auto& sg : segs_) {
      const LayerWeights& L = sets_[size_t(sg.set)].layers[size_t(l)];
      ops::linear(ws.qkv.data() + sg.t0 * ldx, ldx, L.wq_b, L.wq_b_q4,
                  ws.mq.data() + sg.t0 * c.q_dim(), c.q_dim(), sg.t1 - sg.t0, ws.xb.data(), ws.q8);
    }
    q = ws.mq.data();
    ldq = c.q_dim();
  }
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h)
        rope_rows(q + t * ldq + h * qk + nope, ws.cos_g.data() + t * hh, ws.sin_g.data() + t * hh,
                  dr, il);
  });
  // The rows into their page slots: one scale per row covers latent and k_pe.
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const TokenRef& it = ws.items[size_t(t)];
      const KvFormat& f = *it.s->kv->format;
      const int64_t pos = it.s->pos0 + it.i;
      uint8_t* page = it.s->kv->pages[pos / f.page_tokens] + l * f.layer_bytes;
      const int64_t slot = pos % f.page_tokens;
      const float* row = ws.lat.data() + t * D;
      uint8_t* dst = page + f.k_offset + slot * f.row_bytes();
      if (f.elem == kernels::KvElem::kBf16) {
        K.f32_to_bf16(row, reinterpret_cast<uint16_t*>(dst), D);
        continue;
      }
      float sc;
      if (f.dynamic_scales) {
        sc = kv_row_scale(f.elem, row, D);
        reinterpret_cast<uint16_t*>(page + f.k_scale_offset)[slot] = f32_to_bf16(sc);
      } else {
        sc = f.static_k[size_t(l)];
      }
      kv_store_row(f.elem, row, D, sc, dst);
    }
  });

  const int nt = num_threads();
  const int64_t K_idx = c.index_topk;
  if (K_idx > 0) {
    const int64_t ctx = ws.ctx;
    if (ws.keep.size() < size_t(nt * ctx)) {
      ws.keep.resize(size_t(nt * ctx));
      ws.iscore.resize(size_t(nt * ctx));
      ws.iorder.resize(size_t(nt * ctx));
    }
    if (c.index_full[size_t(l)]) mla_index(l, b, T, ldx);
  }

  std::vector<int64_t>& chunk_t0 = chunk_t0_;
  chunk_t0.assign(b.seqs.size(), 0);
  ws.dec_tok.clear();
  bool any_prefill = false;
  {
    int64_t t = 0;
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      chunk_t0[si] = t;
      if (ws.gather_off[si] < 0)
        ws.dec_tok.push_back(int64_t(si));
      else
        any_prefill = true;
      t += b.seqs[si].n_tokens;
    }
  }

  // Decode: absorbed queries, paged attention over the latent rows, W_uv.
  if (!ws.dec_tok.empty()) {
    const LayerWeights& Ld = sets_[size_t(decode_set_)].layers[size_t(l)];
    const int64_t Td = int64_t(ws.dec_tok.size());
    for (int64_t d = 0; d < Td; ++d) {
      const int64_t t = chunk_t0[size_t(ws.dec_tok[size_t(d)])];
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(ws.mdq.data() + (d * H + h) * nope, q + t * ldq + h * qk, size_t(nope) * 4);
        std::memcpy(ws.mql.data() + (d * H + h) * D + R, q + t * ldq + h * qk + nope,
                    size_t(dr) * 4);
      }
    }
    for (int64_t h = 0; h < H; ++h)
      ops::linear(ws.mdq.data() + h * nope, H * nope, Ld.w_uk_t[size_t(h)], kNoQ4,
                  ws.mql.data() + h * D, H * D, Td, ws.xb.data(), ws.q8);
    constexpr int64_t kHeadBlock = 8;
    const int64_t nblk = (H + kHeadBlock - 1) / kHeadBlock;
    const int64_t n_tasks = Td * nblk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_tasks > 1 && nt > 1)
    for (int64_t w = 0; w < n_tasks; ++w) {
      const int tid = omp_get_thread_num();
      const int64_t d = w / nblk, h0 = (w % nblk) * kHeadBlock;
      const int64_t g = std::min(kHeadBlock, H - h0);
      const auto& s = b.seqs[size_t(ws.dec_tok[size_t(d)])];
      const KvFormat& f = *s.kv->format;
      const int64_t n = s.pos0 + 1;
      const uint8_t** kp = ws.ptrs.data() + int64_t(tid) * 4 * ws.max_pages;
      const uint16_t** ksp = reinterpret_cast<const uint16_t**>(kp + ws.max_pages);
      const int64_t t_tok = chunk_t0[size_t(ws.dec_tok[size_t(d)])];
      const bool sparse = K_idx > 0 && ws.sparse[size_t(t_tok)];
      kernels::PagedKv kv;
      if (sparse) {
        // Only the indexer's choice: one pointer per chosen token.
        const int32_t* sel = ws.sel.data() + t_tok * K_idx;
        for (int64_t p = 0; p < K_idx; ++p) {
          const int64_t j = sel[p];
          const uint8_t* page = s.kv->pages[j / f.page_tokens] + l * f.layer_bytes;
          const int64_t slot = j % f.page_tokens;
          kp[p] = page + f.k_offset + slot * f.row_bytes();
          if (f.dynamic_scales)
            ksp[p] = reinterpret_cast<const uint16_t*>(page + f.k_scale_offset) + slot;
        }
        kv.page_tokens = 1;
        kv.n_tokens = K_idx;
      } else {
        const int64_t np = (n + f.page_tokens - 1) / f.page_tokens;
        for (int64_t p = 0; p < np; ++p) {
          const uint8_t* page = s.kv->pages[p] + l * f.layer_bytes;
          kp[p] = page + f.k_offset;
          if (f.dynamic_scales) ksp[p] = reinterpret_cast<const uint16_t*>(page + f.k_scale_offset);
        }
        kv.page_tokens = f.page_tokens;
        kv.n_tokens = n;
      }
      kv.elem = f.elem;
      kv.token_stride = f.row_bytes();
      kv.scale_stride = 1;
      kv.k_pages = kp;
      kv.v_pages = kp;  // the same row is K and V
      if (f.dynamic_scales) {
        kv.k_scales = ksp;
        kv.v_scales = ksp;
      } else if (f.elem != kernels::KvElem::kBf16) {
        kv.k_scale = kv.v_scale = f.static_k[size_t(l)];
      }
      float* sc = ws.scores.data() + int64_t(tid) * std::max<int64_t>(8, kPrefillQueries) * ws.ctx;
      K.paged_attn_decode(ws.mql.data() + (d * H + h0) * D, g, D, c.attn_scale, kv, sc,
                          ws.mol.data() + (d * H + h0) * D);
    }
    for (int64_t h = 0; h < H; ++h)
      ops::linear(ws.mol.data() + h * D, H * D, Ld.w_uv[size_t(h)], kNoQ4,
                  ws.mdv.data() + h * dv, H * dv, Td, ws.xb.data(), ws.q8);
    for (int64_t d = 0; d < Td; ++d) {
      const int64_t t = chunk_t0[size_t(ws.dec_tok[size_t(d)])];
      std::memcpy(ws.attn.data() + t * H * dv, ws.mdv.data() + d * H * dv, size_t(H * dv) * 4);
    }
  }
  if (!any_prefill) return;

  // Prefill: the chunk's context rows in BF16 (earlier ones decoded from the
  // pages, its own from the fresh FP32 rows), expanded to per-head K and V.
  const LayerWeights& Lp = sets_[size_t(prefill_set_)].layers[size_t(l)];
  int64_t rows = 0;
  std::vector<GatherPiece>& pieces = gather_pieces_;
  pieces.clear();
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    if (ws.gather_off[si] < 0) continue;
    const auto& s = b.seqs[si];
    const int64_t pt = s.kv->format->page_tokens;
    for (int64_t j = 0; j < s.pos0 + s.n_tokens;) {
      const int64_t e = std::min((j / pt + 1) * pt, s.pos0 + s.n_tokens);
      pieces.push_back({int64_t(si), j, e});
      j = e;
    }
    rows = std::max(rows, ws.gather_off[si] + s.pos0 + s.n_tokens);
  }
  parallel_for(int64_t(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
    std::vector<float> tmp(static_cast<size_t>(D));
    for (int64_t p = p0; p < p1; ++p) {
      const GatherPiece& pc = pieces[size_t(p)];
      const auto& s = b.seqs[size_t(pc.seq)];
      const KvFormat& f = *s.kv->format;
      for (int64_t j = pc.j0; j < pc.j1; ++j) {
        uint16_t* g = ws.gk.data() + (ws.gather_off[size_t(pc.seq)] + j) * D;
        if (j >= s.pos0) {
          K.f32_to_bf16(ws.lat.data() + (chunk_t0[size_t(pc.seq)] + j - s.pos0) * D, g, D);
          continue;
        }
        const uint8_t* page = s.kv->pages[j / f.page_tokens] + l * f.layer_bytes;
        const int64_t slot = j % f.page_tokens;
        const uint8_t* src = page + f.k_offset + slot * f.row_bytes();
        if (f.elem == kernels::KvElem::kBf16) {
          std::memcpy(g, src, size_t(D) * 2);
          continue;
        }
        const float* table =
            f.elem == kernels::KvElem::kFp8E4m3 ? fp8_e4m3_table() : fp8_e5m2_table();
        const float sc = f.dynamic_scales
                             ? bf16_to_f32(reinterpret_cast<const uint16_t*>(page + f.k_scale_offset)[slot])
                             : f.static_k[size_t(l)];
        for (int64_t d = 0; d < D; ++d) tmp[size_t(d)] = table[src[d]] * sc;
        K.f32_to_bf16(tmp.data(), g, D);
      }
    }
  });
  const int64_t W = nope + dv;
  for (int64_t r0 = 0; r0 < rows; r0 += kExpandRows) {
    const int64_t n = std::min(kExpandRows, rows - r0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < R; ++k)
        ws.mexp_in[size_t(r * R + k)] = bf16_to_f32(ws.gk[size_t((r0 + r) * D + k)]);
    ops::linear(ws.mexp_in.data(), R, Lp.wkv_b, kNoQ4, ws.mexp.data(), H * W, n, ws.mxb.data(),
                ws.q8);
    parallel_for(n, 16, [&](int64_t a, int64_t e) {
      for (int64_t r = a; r < e; ++r) {
        const float* x = ws.mexp.data() + r * H * W;
        uint16_t* kr = ws.ek.data() + (r0 + r) * c.q_dim();
        uint16_t* vr = ws.ev.data() + (r0 + r) * H * dv;
        for (int64_t h = 0; h < H; ++h) {
          K.f32_to_bf16(x + h * W, kr + h * qk, nope);
          std::memcpy(kr + h * qk + nope, ws.gk.data() + (r0 + r) * D + R, size_t(dr) * 2);
          K.f32_to_bf16(x + h * W + nope, vr + h * dv, dv);
        }
      }
    });
  }
  auto& pre = ws.prefill_tasks;
  pre.clear();
  for (size_t si = 0; si < b.seqs.size(); ++si) {
    if (ws.gather_off[si] < 0) continue;
    const auto& s = b.seqs[si];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < s.n_tokens; i += kPrefillQueries)
        pre.push_back({int64_t(si), chunk_t0[si] + i, h, std::min(kPrefillQueries, s.n_tokens - i)});
  }
  const int64_t ldk = c.q_dim(), ldv = H * dv, n_pre = int64_t(pre.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_pre > 1 && nt > 1)
  for (int64_t w = 0; w < n_pre; ++w) {
    const int tid = omp_get_thread_num();
    float* sc = ws.scores.data() + int64_t(tid) * std::max<int64_t>(8, kPrefillQueries) * ws.ctx;
    const auto& task = pre[size_t(w)];
    const int64_t h = task.b, g0 = ws.gather_off[size_t(task.seq)];
    const uint16_t* kbase = ws.ek.data() + g0 * ldk + h * qk;
    const uint16_t* vbase = ws.ev.data() + g0 * ldv + h * dv;
    int64_t ns[kPrefillQueries];
    for (int64_t i = 0; i < task.n; ++i) {
      const TokenRef& it = ws.items[size_t(task.a + i)];
      ns[i] = it.s->pos0 + it.i + 1;
    }
    const float* q0 = q + task.a * ldq + h * qk;
    float* o0 = ws.attn.data() + task.a * ldv + h * dv;
    // DSA: scores of the tokens the indexer did not choose are masked out.
    auto mask = [&](int64_t i, float* row) {
      if (K_idx <= 0 || !ws.sparse[size_t(task.a + i)]) return;
      uint8_t* keep = ws.keep.data() + int64_t(tid) * ws.ctx;
      std::fill(keep, keep + ns[i], uint8_t(0));
      const int32_t* sel = ws.sel.data() + (task.a + i) * K_idx;
      for (int64_t p = 0; p < K_idx; ++p) keep[sel[p]] = 1;
      for (int64_t j = 0; j < ns[i]; ++j)
        if (!keep[j]) row[j] = -INFINITY;
    };
    if (task.n > 1 && K.attn_scores_multi && K.attn_weighted_sum_multi) {
      const int64_t n_max = ns[task.n - 1];
      K.attn_scores_multi(q0, ldq, task.n, kbase, ldk, n_max, qk, c.attn_scale, sc, n_max);
      for (int64_t i = 0; i < task.n; ++i) {
        mask(i, sc + i * n_max);
        K.softmax(sc + i * n_max, ns[i]);
      }
      K.attn_weighted_sum_multi(sc, n_max, ns, task.n, vbase, ldv, dv, o0, ldv);
      continue;
    }
    for (int64_t i = 0; i < task.n; ++i) {
      K.attn_scores(q0 + i * ldq, kbase, ldk, ns[i], qk, c.attn_scale, sc);
      mask(i, sc);
      K.softmax(sc, ns[i]);
      K.attn_weighted_sum(sc, vbase, ldv, ns[i], dv, o0 + i * ldv);
    }
  }
}

// GLM-5's sparse-attention indexer for layer l: each token's index key
// (LayerNorm, RoPE on its first qk_rope values, interleaved) into its page
// as BF16; each token's queries (from the normed q_a) and head weights score
// every cached key, sum_h w_h * relu(q_h . k * index_head_dim^-0.5), and
// the index_topk best (ties to the earlier token) are kept in ascending
// order. Tokens with no more than index_topk of context keep everything.
// Layers that share the choice reuse what this layer left in the workspace.
void Model::mla_index(int64_t l, const Batch& b, int64_t T, int64_t ldx) {
  const auto& c = cfg_;
  const auto& K = kernels::active();
  auto& ws = *ws_;
  static const Q4Matrix kNoQ4;
  const int64_t ih = c.index_heads, ihd = c.index_head_dim, dr = c.qk_rope_dim, Kt = c.index_topk;
  const int64_t qa = c.q_lora_rank, ko = qa + c.cache_dim(), hh = c.head_dim / 2;
  const LayerWeights& L0 = sets_[0].layers[size_t(l)];
  parallel_for(T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* k = ws.qkv.data() + t * ldx + ko;
      double mean = 0, var = 0;
      for (int64_t d = 0; d < ihd; ++d) mean += k[d];
      mean /= double(ihd);
      for (int64_t d = 0; d < ihd; ++d) var += (k[d] - mean) * (k[d] - mean);
      const float inv = float(1.0 / std::sqrt(var / double(ihd) + 1e-6));
      for (int64_t d = 0; d < ihd; ++d)
        k[d] = (k[d] - float(mean)) * inv * L0.idx_k_norm[size_t(d)] + L0.idx_k_bias[size_t(d)];
      rope_rows(k, ws.cos_g.data() + t * hh, ws.sin_g.data() + t * hh, dr, true);
      const TokenRef& it = ws.items[size_t(t)];
      const KvFormat& f = *it.s->kv->format;
      const int64_t pos = it.s->pos0 + it.i;
      uint8_t* page = it.s->kv->pages[pos / f.page_tokens] + l * f.layer_bytes;
      K.f32_to_bf16(k, reinterpret_cast<uint16_t*>(page + f.index_offset) + (pos % f.page_tokens) * ihd,
                    ihd);
    }
  });
  ws.iq.resize(size_t(T * ih * ihd));
  for (const auto& sg : segs_) {
    const LayerWeights& L = sets_[size_t(sg.set)].layers[size_t(l)];
    ops::linear(ws.qkv.data() + sg.t0 * ldx, ldx, L.idx_wq_b, kNoQ4, ws.iq.data() + sg.t0 * ih * ihd,
                ih * ihd, sg.t1 - sg.t0, ws.xb.data(), ws.q8);
  }
  ws.sel.resize(size_t(T * Kt));
  ws.sparse.assign(size_t(T), 0);
  const int nt = num_threads();
  const float qscale = 1.f / std::sqrt(float(ihd)), wscale = 1.f / std::sqrt(float(ih));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (T > 1 && nt > 1)
  for (int64_t t = 0; t < T; ++t) {
    const int tid = omp_get_thread_num();
    float* q = ws.iq.data() + t * ih * ihd;
    for (int64_t h = 0; h < ih; ++h)
      rope_rows(q + h * ihd, ws.cos_g.data() + t * hh, ws.sin_g.data() + t * hh, dr, true);
    const TokenRef& it = ws.items[size_t(t)];
    const KvFormat& f = *it.s->kv->format;
    const int64_t n = it.s->pos0 + it.i + 1;
    if (n <= Kt) continue;
    ws.sparse[size_t(t)] = 1;
    const float* w = ws.qkv.data() + t * ldx + ko + ihd;
    float* s = ws.iscore.data() + int64_t(tid) * ws.ctx;
    float kf[1024];
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* page = it.s->kv->pages[j / f.page_tokens] + l * f.layer_bytes;
      const uint16_t* kr = reinterpret_cast<const uint16_t*>(page + f.index_offset) + (j % f.page_tokens) * ihd;
      for (int64_t d = 0; d < ihd; ++d) kf[d] = bf16_to_f32(kr[d]);
      float acc = 0.f;
      for (int64_t h = 0; h < ih; ++h) {
        float dot = 0.f;
        for (int64_t d = 0; d < ihd; ++d) dot = std::fma(q[h * ihd + d], kf[d], dot);
        acc += w[h] * wscale * std::max(0.f, dot * qscale);
      }
      s[j] = acc;
    }
    int32_t* order = ws.iorder.data() + int64_t(tid) * ws.ctx;
    for (int64_t j = 0; j < n; ++j) order[j] = int32_t(j);
    std::nth_element(order, order + Kt, order + n, [&](int32_t a, int32_t b2) {
      return s[a] > s[b2] || (s[a] == s[b2] && a < b2);
    });
    std::sort(order, order + Kt);
    std::copy(order, order + Kt, ws.sel.data() + t * Kt);
  }
}

}  // namespace kvant
