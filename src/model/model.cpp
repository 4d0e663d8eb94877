// The decoder forward pass shared by every dense architecture; the per-family
// differences (QKV bias, QK-norm, post-norms, sliding windows, activation,
// embedding scale, soft-capping) are switches in ModelConfig.
#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/kernels.h"
#include "model/loader.h"
#include "model/ops.h"
#include "numerics/bf16.h"

namespace kvant {

SeqKv::SeqKv(const ModelConfig& c, int64_t capacity) : capacity_(capacity), kv_dim_(c.kv_dim()) {
  for (int64_t l = 0; l < c.layers; ++l) {
    k_.emplace_back(size_t(capacity * kv_dim_));
    v_.emplace_back(size_t(capacity * kv_dim_));
  }
}

int64_t Batch::logit_rows() const {
  int64_t r = 0;
  for (auto& s : seqs) r += s.all_logits ? s.n_tokens : 1;
  return r;
}

struct TokenRef {  // where token t of the batch sits: its chunk and index in it
  const SeqChunk* s;
  int64_t t, i;
};

struct Model::Workspace {
  int64_t tokens = 0, ctx = 0;
  std::vector<TokenRef> items;  // [T], rebuilt each forward (capacity kept)
  AlignedBuffer<float> x, h, qkv, attn, gu, act, out;
  AlignedBuffer<uint16_t> xb;
  AlignedBuffer<float> cos_g, sin_g, cos_l, sin_l;  // [T, hd/2]
  AlignedBuffer<float> scores;                     // [threads, ctx]
};

namespace {

std::vector<float> inv_freq_for(const RopeConfig& r, int64_t hd, const std::vector<float>& factors) {
  std::vector<float> f(size_t(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) {
    // As transformers computes it: base ** (2i/d) in FP32, then 1/x.
    float e = float(2 * i) / float(hd);
    f[size_t(i)] = 1.f / float(std::pow(double(r.theta), double(e)));
  }
  if (!factors.empty())
    for (int64_t i = 0; i < hd / 2; ++i) f[size_t(i)] /= factors[size_t(i)];
  if (r.scaling == RopeScaling::Linear) {
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
      const double s = (old_ctx / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      x = float((1.0 - s) * x / r.factor + s * x);
    }
  }
  return f;
}

}  // namespace

Model::Model(ModelConfig cfg, ModelWeights w) : cfg_(std::move(cfg)), w_(std::move(w)) {
  inv_freq_ = inv_freq_for(cfg_.rope, cfg_.head_dim, w_.rope_freq_factors);
  inv_freq_local_ = inv_freq_for(cfg_.rope_local, cfg_.head_dim, w_.rope_freq_factors);
  ws_ = std::make_unique<Workspace>();
}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& path) {
  auto m = load_model(path);
  if (!m) return m.error();
  return std::make_unique<Model>(std::move(m->config), std::move(m->weights));
}

void Model::ensure_workspace(int64_t T, int64_t ctx) {
  auto& ws = *ws_;
  if (T > ws.tokens) {
    const auto& c = cfg_;
    const int64_t qkv = c.q_dim() + 2 * c.kv_dim();
    const int64_t widest = std::max({c.hidden, c.q_dim(), c.ffn});
    ws.x = AlignedBuffer<float>(size_t(T * c.hidden));
    ws.h = AlignedBuffer<float>(size_t(T * c.hidden));
    ws.out = AlignedBuffer<float>(size_t(T * c.hidden));
    ws.qkv = AlignedBuffer<float>(size_t(T * qkv));
    ws.attn = AlignedBuffer<float>(size_t(T * c.q_dim()));
    ws.gu = AlignedBuffer<float>(size_t(T * 2 * c.ffn));
    ws.act = AlignedBuffer<float>(size_t(T * c.ffn));
    ws.xb = AlignedBuffer<uint16_t>(size_t(T * widest));
    const size_t half = size_t(T * c.head_dim / 2);
    ws.cos_g = AlignedBuffer<float>(half);
    ws.sin_g = AlignedBuffer<float>(half);
    ws.cos_l = AlignedBuffer<float>(half);
    ws.sin_l = AlignedBuffer<float>(half);
    ws.tokens = T;
  }
  if (ctx > ws.ctx) {
    ws.scores = AlignedBuffer<float>(size_t(num_threads() * ctx));
    ws.ctx = ctx;
  }
}

void Model::rope_tables(const Batch& b, int64_t T) {
  const int64_t h = cfg_.head_dim / 2;
  auto& ws = *ws_;
  int64_t t = 0;
  for (auto& s : b.seqs) {
    for (int64_t i = 0; i < s.n_tokens; ++i, ++t) {
      const float pos = float(s.pos0 + i);
      for (int64_t j = 0; j < h; ++j) {
        const float ag = pos * inv_freq_[size_t(j)];
        const float al = pos * inv_freq_local_[size_t(j)];
        ws.cos_g[size_t(t * h + j)] = std::cos(ag);
        ws.sin_g[size_t(t * h + j)] = std::sin(ag);
        ws.cos_l[size_t(t * h + j)] = std::cos(al);
        ws.sin_l[size_t(t * h + j)] = std::sin(al);
      }
    }
  }
  KV_CHECK_EQ(t, T);
}

Result<void> Model::forward(const Batch& b, std::span<float> logits) {
  const auto& c = cfg_;
  const int64_t T = int64_t(b.tokens.size());
  int64_t total = 0, max_ctx = 0;
  for (auto& s : b.seqs) {
    if (!s.kv || s.n_tokens <= 0) return make_error("forward: empty sequence chunk");
    if (s.pos0 < 0 || s.pos0 + s.n_tokens > s.kv->capacity())
      return make_error("forward: positions [" + std::to_string(s.pos0) + ", " +
                        std::to_string(s.pos0 + s.n_tokens) + ") exceed the sequence's KV capacity " +
                        std::to_string(s.kv->capacity()));
    total += s.n_tokens;
    max_ctx = std::max(max_ctx, s.pos0 + s.n_tokens);
  }
  if (total != T) return make_error("forward: token count does not match the chunks");
  for (int32_t tok : b.tokens)
    if (tok < 0 || tok >= c.vocab)
      return make_error("forward: token id " + std::to_string(tok) + " outside the vocabulary [0, " + std::to_string(c.vocab) + ")");
  if (int64_t(logits.size()) < b.logit_rows() * c.vocab) return make_error("forward: logits buffer too small");

  ensure_workspace(T, max_ctx);
  auto& ws = *ws_;
  // Embedding lookup (BF16 rows -> FP32), scaled for Gemma.
  for (int64_t t = 0; t < T; ++t) {
    w_.embed.row_f32(b.tokens[size_t(t)], c.embed_scale, ws.x.data() + t * c.hidden);
  }
  ws.items.clear();
  {
    int64_t t = 0;
    for (auto& s : b.seqs)
      for (int64_t i = 0; i < s.n_tokens; ++i) ws.items.push_back({&s, t++, i});
  }
  rope_tables(b, T);
  for (int64_t l = 0; l < c.layers; ++l) layer_forward(l, b, T);

  // Final norm and logits for the rows that want them.
  int64_t r = 0, t0 = 0;
  for (auto& s : b.seqs) {
    const int64_t first = s.all_logits ? t0 : t0 + s.n_tokens - 1;
    for (int64_t t = first; t < t0 + s.n_tokens; ++t, ++r) {
      ops::rmsnorm(ws.x.data() + t * c.hidden, w_.out_norm.data(), c.rms_eps, ws.h.data() + r * c.hidden, c.hidden);
    }
    t0 += s.n_tokens;
  }
  ops::to_bf16(ws.h.data(), c.hidden, ws.xb.data(), c.hidden, r, c.hidden);
  ops::matmul(ws.xb.data(), c.hidden, w_.lm_head(), logits.data(), c.vocab, r);
  if (c.final_softcap > 0.f) {
    for (int64_t i = 0; i < r * c.vocab; ++i)
      logits[size_t(i)] = std::tanh(logits[size_t(i)] / c.final_softcap) * c.final_softcap;
  }
  return {};
}

void Model::layer_forward(int64_t l, const Batch& b, int64_t T) {
  const auto& c = cfg_;
  const auto& L = w_.layers[size_t(l)];
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t H = c.hidden, qkv_n = c.q_dim() + 2 * c.kv_dim();

  // Attention block.
  for (int64_t t = 0; t < T; ++t)
    ops::rmsnorm(ws.x.data() + t * H, L.attn_norm.data(), c.rms_eps, ws.h.data() + t * H, H);
  ops::to_bf16(ws.h.data(), H, ws.xb.data(), H, T, H);
  ops::matmul(ws.xb.data(), H, L.wqkv, ws.qkv.data(), qkv_n, T);
  attention(l, b, T);
  ops::to_bf16(ws.attn.data(), c.q_dim(), ws.xb.data(), c.q_dim(), T, c.q_dim());
  ops::matmul(ws.xb.data(), c.q_dim(), L.wo, ws.out.data(), H, T);
  for (int64_t t = 0; t < T; ++t) {
    float* o = ws.out.data() + t * H;
    if (!L.post_attn_norm.empty()) ops::rmsnorm(o, L.post_attn_norm.data(), c.rms_eps, o, H);
    float* x = ws.x.data() + t * H;
    for (int64_t i = 0; i < H; ++i) x[i] += o[i];
  }

  // MLP block.
  for (int64_t t = 0; t < T; ++t)
    ops::rmsnorm(ws.x.data() + t * H, L.ffn_norm.data(), c.rms_eps, ws.h.data() + t * H, H);
  ops::to_bf16(ws.h.data(), H, ws.xb.data(), H, T, H);
  ops::matmul(ws.xb.data(), H, L.w_gate_up, ws.gu.data(), 2 * c.ffn, T);
  for (int64_t t = 0; t < T; ++t) {
    const float* g = ws.gu.data() + t * 2 * c.ffn;
    float* a = ws.act.data() + t * c.ffn;
    if (c.act == Activation::GeluTanh) K.gelu_tanh_mul(g, g + c.ffn, a, c.ffn);
    else K.silu_mul(g, g + c.ffn, a, c.ffn);
  }
  ops::to_bf16(ws.act.data(), c.ffn, ws.xb.data(), c.ffn, T, c.ffn);
  ops::matmul(ws.xb.data(), c.ffn, L.w_down, ws.out.data(), H, T);
  for (int64_t t = 0; t < T; ++t) {
    float* o = ws.out.data() + t * H;
    if (!L.post_ffn_norm.empty()) ops::rmsnorm(o, L.post_ffn_norm.data(), c.rms_eps, o, H);
    float* x = ws.x.data() + t * H;
    for (int64_t i = 0; i < H; ++i) x[i] += o[i];
  }
}

void Model::attention(int64_t l, const Batch& b, int64_t T) {
  const auto& c = cfg_;
  const auto& L = w_.layers[size_t(l)];
  const auto& K = kernels::active();
  auto& ws = *ws_;
  const int64_t hd = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim(), qkv_n = qd + 2 * kvd;
  const bool sliding = c.sliding[size_t(l)] && c.sliding_window > 0;
  const float* cosb = sliding ? ws.cos_l.data() : ws.cos_g.data();
  const float* sinb = sliding ? ws.sin_l.data() : ws.sin_g.data();

  // Bias, QK-norm, RoPE; then append K/V to each sequence's store.
  int64_t t = 0;
  for (auto& s : b.seqs) {
    for (int64_t i = 0; i < s.n_tokens; ++i, ++t) {
      float* row = ws.qkv.data() + t * qkv_n;
      if (!L.bqkv.empty())
        for (int64_t j = 0; j < qkv_n; ++j) row[j] += L.bqkv[size_t(j)];
      for (int64_t h = 0; h < c.heads + c.kv_heads; ++h) {
        float* x = row + h * hd;
        if (c.qk_norm) ops::rmsnorm(x, h < c.heads ? L.q_norm.data() : L.k_norm.data(), c.rms_eps, x, hd);
        ops::rope(x, cosb + t * hd / 2, sinb + t * hd / 2, hd);
      }
      K.f32_to_bf16(row + qd, s.kv->k(l, s.pos0 + i), kvd);
      K.f32_to_bf16(row + qd + kvd, s.kv->v(l, s.pos0 + i), kvd);
    }
  }

  // Causal (optionally windowed) softmax attention, one (token, head) per task.
  const auto& items = ws.items;
  const int64_t group = c.heads / c.kv_heads;
  parallel_for(T * c.heads, 1, [&](int64_t w0, int64_t w1) {
    float* sc = ws.scores.data() + int64_t(omp_get_thread_num()) * ws.ctx;
    for (int64_t w = w0; w < w1; ++w) {
      const TokenRef& it = items[size_t(w / c.heads)];
      const int64_t h = w % c.heads, kvh = h / group;
      const int64_t pos = it.s->pos0 + it.i;
      const int64_t j0 = sliding ? std::max<int64_t>(0, pos - c.sliding_window + 1) : 0;
      const int64_t n = pos - j0 + 1;
      const int64_t ld = it.s->kv->row_stride();
      const float* q = ws.qkv.data() + it.t * qkv_n + h * hd;
      K.attn_scores(q, it.s->kv->k(l, j0) + kvh * hd, ld, n, hd, c.attn_scale, sc);
      if (c.attn_softcap > 0.f)
        for (int64_t j = 0; j < n; ++j) sc[j] = std::tanh(sc[j] / c.attn_softcap) * c.attn_softcap;
      K.softmax(sc, n);
      K.attn_weighted_sum(sc, it.s->kv->v(l, j0) + kvh * hd, ld, n, hd, ws.attn.data() + it.t * qd + h * hd);
    }
  });
}

}  // namespace kvant
