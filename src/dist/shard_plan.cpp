// The shard plan's arithmetic (shard_plan.h). Reads ModelConfig's fields
// and inline helpers only: no model code is linked.
#include "dist/shard_plan.h"

#include <algorithm>
#include <string>

namespace kvant::dist {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

Error plan_error(const std::string& what) { return make_error("shard plan: " + what); }

bool is_moe_layer(const ModelConfig& c, int64_t i) {
  return c.n_experts > 0 && size_t(i) < c.moe_layer.size() && c.moe_layer[size_t(i)] != 0;
}

bool has_indexer(const ModelConfig& c, int64_t i) {
  return c.mla() && c.index_topk > 0 && size_t(i) < c.index_full.size() &&
         c.index_full[size_t(i)] != 0;
}

// Piece `index` of `parts` over [0, n): whole blocks of `align`, the first
// (blocks % parts) pieces one block longer. One part: [0, n), unaligned.
Result<Range> split_aligned(int64_t n, int parts, int index, int64_t align, const std::string& what,
                            const std::string& hint = "") {
  if (parts == 1) return Range{0, n};
  const std::string head = what + " " + num(n) + " cannot be split over " + num(parts) +
                           " ranks in multiples of " + num(align) + " (";
  if (n % align != 0)
    return plan_error(head + "it is not a multiple of " + num(align) + ")" + hint);
  const int64_t blocks = n / align;
  if (blocks < parts)
    return plan_error(head + "only " + num(blocks) + " blocks of " + num(align) + " for " +
                      num(parts) + " ranks)" + hint);
  const int64_t base = blocks / parts, extra = blocks % parts;
  const int64_t first = index * base + std::min<int64_t>(index, extra);
  const int64_t count = base + (index < extra ? 1 : 0);
  return Range{first * align, (first + count) * align};
}

Result<void> check_ranks(int tp, int tp_rank, int ep, int ep_rank, int64_t align) {
  if (tp < 1) return plan_error("tp must be at least 1, got " + num(tp));
  if (ep < 1) return plan_error("ep must be at least 1, got " + num(ep));
  if (tp_rank < 0 || tp_rank >= tp)
    return plan_error("tp_rank " + num(tp_rank) + " is out of range for tp " + num(tp) + " (0.." +
                      num(tp - 1) + ")");
  if (ep_rank < 0 || ep_rank >= ep)
    return plan_error("ep_rank " + num(ep_rank) + " is out of range for ep " + num(ep) + " (0.." +
                      num(ep - 1) + ")");
  if (align < 1) return plan_error("align must be positive, got " + num(align));
  return {};
}

// Piece `index` of `parts` over [0, n) in units of 1: the first n % parts
// pieces one longer.
Range split_even(int64_t n, int64_t parts, int64_t index) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t first = index * base + std::min(index, extra);
  return {first, first + base + (index < extra ? 1 : 0)};
}

// Query heads and KV heads (or the MLA latent) of this rank.
Result<void> plan_attention(const ModelConfig& c, ShardPlan& p) {
  const int64_t tp = p.tp, r = p.tp_rank;
  if (c.heads < 1) return plan_error("heads must be positive, got " + num(c.heads));
  auto set_out_aligned = [&] {
    const int64_t w = c.mla() ? c.v_head_dim : c.head_dim;
    p.attn_out_aligned = (p.q_heads.begin * w) % p.align == 0 &&
                         (p.q_heads.end == c.heads || (p.q_heads.end * w) % p.align == 0);
  };
  if (c.mla()) {
    // Heads as evenly as they go (the first heads % tp ranks one more).
    if (c.heads < tp)
      return plan_error("heads " + num(c.heads) + " is fewer than tp " + num(tp));
    p.q_heads = split_even(c.heads, tp, r);
    p.kv_heads = {0, 1};
    p.kv_replicas = tp;
    p.mla_latent_replicated = true;
    set_out_aligned();
    return {};
  }
  const int64_t kv = c.kv_heads;
  if (kv < 1) return plan_error("kv_heads must be positive, got " + num(kv));
  if (c.heads % kv != 0)
    return plan_error("heads " + num(c.heads) + " is not a multiple of kv_heads " + num(kv));
  const int64_t group = c.heads / kv;
  if (kv >= tp) {
    // Whole KV groups (a KV head and the query heads that read it), as
    // evenly as they go: 3 KV heads over 2 ranks hold 2 and 1.
    p.kv_heads = split_even(kv, tp, r);
    p.q_heads = {p.kv_heads.begin * group, p.kv_heads.end * group};
    p.kv_replicas = 1;
    set_out_aligned();
    return {};
  }
  if (c.heads % tp != 0)
    return plan_error("heads " + num(c.heads) + " is not a multiple of tp " + num(tp) +
                      " (with fewer KV heads than ranks, query heads split evenly)");
  const int64_t hq = c.heads / tp;
  p.q_heads = {r * hq, (r + 1) * hq};
  set_out_aligned();
  if (tp % kv == 0) {
    // Ranks [h * tp/kv, (h+1) * tp/kv) all serve query heads of group h.
    const int64_t replicas = tp / kv, h = r / replicas;
    p.kv_heads = {h, h + 1};
    p.kv_replicas = replicas;
  } else {
    return plan_error("kv_heads " + num(kv) + " and tp " + num(tp) +
                      ": with fewer KV heads than ranks, kv_heads must divide tp (each KV head "
                      "replicated over tp/kv_heads ranks)");
  }
  return {};
}

// Dense MLP, shared experts, routed experts.
Result<void> plan_mlp(const ModelConfig& c, ShardPlan& p) {
  bool dense = false, routed = false;
  for (int64_t i = 0; i < c.layers; ++i) (is_moe_layer(c, i) ? routed : dense) = true;
  if (dense) {
    auto f = split_aligned(c.ffn, p.tp, p.tp_rank, p.align, "ffn");
    if (!f) return f.error();
    p.ffn = *f;
  }
  if (!routed) {
    if (p.ep > 1)
      return plan_error("ep " + num(p.ep) + " needs routed experts, and this model has none");
    return {};
  }
  if (c.moe_shared_ffn > 0) {
    auto s = split_aligned(c.moe_shared_ffn, p.tp, p.tp_rank, p.align, "moe_shared_ffn");
    if (!s) return s.error();
    p.shared_ffn = *s;
  }
  if (c.n_experts % p.ep != 0)
    return plan_error("n_experts " + num(c.n_experts) + " is not a multiple of ep " + num(p.ep));
  const int64_t e = c.n_experts / p.ep;
  p.experts = {p.ep_rank * e, (p.ep_rank + 1) * e};
  if (p.ep > 1) {
    p.moe_ffn = {0, c.moe_ffn};
  } else {
    auto m = split_aligned(c.moe_ffn, p.tp, p.tp_rank, p.align, "moe_ffn",
                           "; with ep > 1 experts are held whole instead");
    if (!m) return m.error();
    p.moe_ffn = *m;
  }
  return {};
}

// The parameters of layer i given the sizes a rank holds: hq query heads,
// hkv KV heads, and the MLP ranges.
struct Held {
  int64_t hq, hkv, ffn, shared, experts, moe_ffn, vocab;
};

int64_t attention_params(const ModelConfig& c, int64_t i, const Held& h) {
  const int64_t H = c.hidden;
  if (!c.mla()) {
    const int64_t q = h.hq * c.head_dim, kv = h.hkv * c.head_dim;
    int64_t n = (q + 2 * kv) * H + H * q;  // wq, wk, wv; wo
    if (c.qkv_bias) n += q + 2 * kv;
    if (c.qk_norm) n += 2 * c.head_dim;  // q_norm, k_norm: one head's width, shared
    return n;
  }
  const int64_t R = c.kv_lora_rank, Q = c.q_lora_rank;
  int64_t n = 0;
  if (Q > 0)
    n += Q * H + Q + h.hq * c.head_dim * Q;  // q_a, q_a_layernorm (replicated); q_b (split)
  else
    n += h.hq * c.head_dim * H;              // q_proj (split)
  n += (R + c.qk_rope_dim) * H + R;          // kv_a_proj_with_mqa, kv_a_layernorm (replicated)
  n += h.hq * (c.qk_nope_dim + c.v_head_dim) * R;  // kv_b (split by head)
  n += H * h.hq * c.v_head_dim;                    // o_proj (split by head)
  if (has_indexer(c, i))  // wk, weights_proj, wq_b, k_norm weight and bias (replicated)
    n += (c.index_head_dim + c.index_heads) * H + c.index_heads * c.index_head_dim * Q +
         2 * c.index_head_dim;
  return n;
}

int64_t params(const ModelConfig& c, const Held& h) {
  const int64_t H = c.hidden;
  int64_t n = h.vocab * H * (c.tie_embeddings ? 1 : 2) + H;  // embed, output, out_norm
  for (int64_t i = 0; i < c.layers; ++i) {
    n += H + attention_params(c, i, h) + H;  // attn_norm, attention, ffn_norm
    if (c.post_norms) n += 2 * H;
    if (is_moe_layer(c, i)) {
      n += c.n_experts * H + (c.moe_sigmoid ? c.n_experts : 0);  // router, correction bias
      n += 3 * h.shared * H + h.experts * 3 * h.moe_ffn * H;
    } else {
      n += 3 * h.ffn * H;  // gate, up, down
    }
  }
  return n;
}

}  // namespace

int64_t Range::size() const { return end - begin; }

Result<ShardPlan> make_shard_plan(const ModelConfig& c, int tp, int tp_rank, int ep, int ep_rank,
                                  int64_t align) {
  KV_TRY(check_ranks(tp, tp_rank, ep, ep_rank, align));
  ShardPlan p;
  p.tp = tp, p.tp_rank = tp_rank, p.ep = ep, p.ep_rank = ep_rank, p.align = align;
  KV_TRY(plan_attention(c, p));
  KV_TRY(plan_mlp(c, p));
  if (c.vocab < 1) return plan_error("vocab must be positive, got " + num(c.vocab));
  p.vocab_per_rank = (c.vocab + tp - 1) / tp;
  p.vocab_padded = p.vocab_per_rank * tp;
  p.vocab = {std::min(c.vocab, tp_rank * p.vocab_per_rank),
             std::min(c.vocab, (tp_rank + 1) * p.vocab_per_rank)};
  return p;
}

ModelConfig local_config(const ModelConfig& c, const ShardPlan& p) {
  ModelConfig l = c;
  l.heads = p.q_heads.size();
  if (!c.mla()) l.kv_heads = p.kv_heads.size();
  if (p.ffn.size() > 0) l.ffn = p.ffn.size();
  if (p.moe_ffn.size() > 0) l.moe_ffn = p.moe_ffn.size();
  if (p.shared_ffn.size() > 0) l.moe_shared_ffn = p.shared_ffn.size();
  return l;
}

int64_t shard_weight_params(const ModelConfig& c, const ShardPlan& p) {
  return params(c, {p.q_heads.size(), p.kv_heads.size(), p.ffn.size(), p.shared_ffn.size(),
                    p.experts.size(), p.moe_ffn.size(), p.vocab.size()});
}

int64_t full_weight_params(const ModelConfig& c) {
  return params(c, {c.heads, c.mla() ? 1 : c.kv_heads, c.ffn, c.moe_shared_ffn, c.n_experts,
                    c.moe_ffn, c.vocab});
}

}  // namespace kvant::dist
