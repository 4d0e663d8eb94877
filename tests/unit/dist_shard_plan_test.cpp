// The tensor/expert-parallel shard plan (dist/shard_plan): ranges that tile
// heads, intermediate columns, vocabulary and experts across ranks, KV heads
// replicated when there are fewer than ranks, the MLA latent replicated,
// every error, and the parameter identity: summed over ranks, what the ranks
// hold is the whole model plus what each extra rank repeats. No model needed.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dist/shard_plan.h"

namespace kvant::dist {
namespace {

// Llama 3 8B's sizes (8,030,261,248 parameters).
ModelConfig llama3_8b() {
  ModelConfig c;
  c.vocab = 128256, c.hidden = 4096, c.layers = 32, c.heads = 32, c.kv_heads = 8;
  c.head_dim = 128, c.ffn = 14336;
  return c;
}

// Qwen3-30B-A3B's sizes (30,532,122,624): every layer routed, 128 experts
// of 768, q/k norms, no shared expert.
ModelConfig qwen3_moe() {
  ModelConfig c;
  c.vocab = 151936, c.hidden = 2048, c.layers = 48, c.heads = 32, c.kv_heads = 4;
  c.head_dim = 128, c.ffn = 6144, c.qk_norm = true;
  c.n_experts = 128, c.moe_top_k = 8, c.moe_ffn = 768;
  c.moe_layer.assign(48, 1);
  return c;
}

// DeepSeek-V3's sizes without its MTP layer (671,026,419,200): MLA with
// q_lora, three dense layers then 58 routed ones of 256 experts and one
// shared expert, sigmoid routing with a correction bias.
ModelConfig deepseek_v3() {
  ModelConfig c;
  c.vocab = 129280, c.hidden = 7168, c.layers = 61, c.heads = 128, c.kv_heads = 128;
  c.qk_nope_dim = 128, c.qk_rope_dim = 64, c.v_head_dim = 128, c.head_dim = 192;
  c.kv_lora_rank = 512, c.q_lora_rank = 1536, c.ffn = 18432;
  c.n_experts = 256, c.moe_top_k = 8, c.moe_ffn = 2048, c.moe_shared_ffn = 2048;
  c.moe_sigmoid = true;
  c.moe_layer.assign(61, 1);
  for (int i = 0; i < 3; ++i) c.moe_layer[size_t(i)] = 0;
  return c;
}

ShardPlan plan(const ModelConfig& c, int tp, int tp_rank, int ep = 1, int ep_rank = 0,
               int64_t align = 128) {
  auto p = make_shard_plan(c, tp, tp_rank, ep, ep_rank, align);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return p.ok() ? *p : ShardPlan{};
}

// The ranges of ranks 0..n-1 tile [0, total) in order, without gaps or overlaps.
void expect_tiles(const std::vector<Range>& rs, int64_t total, const std::string& what) {
  int64_t at = 0;
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_EQ(rs[r].begin, at) << what << " rank " << r;
    EXPECT_GE(rs[r].size(), 0) << what << " rank " << r;
    at = rs[r].end;
  }
  EXPECT_EQ(at, total) << what;
}

std::vector<Range> ranges(const ModelConfig& c, int tp, int ep,
                          const std::function<Range(const ShardPlan&)>& get) {
  std::vector<Range> out;
  const int n = std::max(tp, ep);  // EP over the TP ranks when both are above 1
  for (int r = 0; r < n; ++r)
    out.push_back(get(plan(c, tp, tp > 1 ? r : 0, ep, ep > 1 ? r : 0)));
  return out;
}

// Sum of shard_weight_params over ranks 0..n-1, EP over the TP ranks.
int64_t params_over_ranks(const ModelConfig& c, int tp, int ep) {
  int64_t n = 0;
  for (int r = 0; r < std::max(tp, ep); ++r)
    n += shard_weight_params(c, plan(c, tp, tp > 1 ? r : 0, ep, ep > 1 ? r : 0));
  return n;
}

void expect_error(const ModelConfig& c, int tp, int tp_rank, int ep, int ep_rank,
                  const std::string& message, int64_t align = 128) {
  auto p = make_shard_plan(c, tp, tp_rank, ep, ep_rank, align);
  ASSERT_FALSE(p.ok()) << "expected: " << message;
  EXPECT_EQ(p.error().message, "shard plan: " + message);
}

TEST(ShardPlan, OneRankHoldsEverything) {
  const ModelConfig c = deepseek_v3();
  const ShardPlan p = plan(c, 1, 0);
  EXPECT_EQ(p.q_heads, (Range{0, 128}));
  EXPECT_EQ(p.ffn, (Range{0, 18432}));
  EXPECT_EQ(p.shared_ffn, (Range{0, 2048}));
  EXPECT_EQ(p.experts, (Range{0, 256}));
  EXPECT_EQ(p.moe_ffn, (Range{0, 2048}));
  EXPECT_EQ(p.vocab, (Range{0, 129280}));
  EXPECT_EQ(p.vocab_padded, 129280);
  EXPECT_EQ(shard_weight_params(c, p), full_weight_params(c));
}

TEST(ShardPlan, FullParamsMatchPublishedTotals) {
  EXPECT_EQ(full_weight_params(llama3_8b()), 8030261248);
  EXPECT_EQ(full_weight_params(qwen3_moe()), 30532122624);
  EXPECT_EQ(full_weight_params(deepseek_v3()), 671026419200);
  ModelConfig tied = llama3_8b();
  tied.tie_embeddings = true;
  EXPECT_EQ(full_weight_params(tied), 8030261248 - 128256 * 4096);
}

TEST(ShardPlan, RangesTileHeadsFfnVocabAndExperts) {
  const ModelConfig l = llama3_8b();
  for (int tp : {1, 2, 4, 8}) {
    const std::string t = " tp " + std::to_string(tp);
    expect_tiles(ranges(l, tp, 1, [](const ShardPlan& p) { return p.q_heads; }), 32, "heads" + t);
    expect_tiles(ranges(l, tp, 1, [](const ShardPlan& p) { return p.kv_heads; }), 8, "kv" + t);
    expect_tiles(ranges(l, tp, 1, [](const ShardPlan& p) { return p.ffn; }), 14336, "ffn" + t);
    expect_tiles(ranges(l, tp, 1, [](const ShardPlan& p) { return p.vocab; }), 128256, "vocab" + t);
    EXPECT_EQ(plan(l, tp, 0).kv_replicas, 1);
  }
  const ModelConfig d = deepseek_v3();
  for (int w : {2, 8, 16}) {
    const std::string t = " w " + std::to_string(w);
    expect_tiles(ranges(d, w, w, [](const ShardPlan& p) { return p.experts; }), 256, "experts" + t);
    expect_tiles(ranges(d, w, w, [](const ShardPlan& p) { return p.shared_ffn; }), 2048, "shared" + t);
    expect_tiles(ranges(d, w, 1, [](const ShardPlan& p) { return p.moe_ffn; }), 2048, "moe_ffn" + t);
    EXPECT_EQ(plan(d, w, 0, w, 0).moe_ffn, (Range{0, 2048})) << "EP keeps experts whole" << t;
  }
  // Experts over ep ranks with tp 1 (attention replicated).
  expect_tiles(ranges(qwen3_moe(), 1, 4, [](const ShardPlan& p) { return p.experts; }), 128,
               "experts ep 4");
}

TEST(ShardPlan, UnevenFfnSplitsInAlignedBlocks) {
  ModelConfig c = llama3_8b();
  c.ffn = 11008;  // 86 blocks of 128 over 4 ranks: 22, 22, 21, 21
  auto rs = ranges(c, 4, 1, [](const ShardPlan& p) { return p.ffn; });
  expect_tiles(rs, 11008, "ffn");
  const int64_t want[] = {22 * 128, 22 * 128, 21 * 128, 21 * 128};
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(rs[r].size(), want[r]) << r;
    EXPECT_EQ(rs[r].begin % 128, 0) << r;
  }
  // A smaller alignment splits finer.
  EXPECT_EQ(plan(c, 4, 0, 1, 0, 64).ffn, (Range{0, 2752}));
}

TEST(ShardPlan, VocabLastPieceShorterAndPaddedSize) {
  ModelConfig c = llama3_8b();
  c.vocab = 10;
  auto rs = ranges(c, 4, 1, [](const ShardPlan& p) { return p.vocab; });
  expect_tiles(rs, 10, "vocab");
  EXPECT_EQ(rs[0], (Range{0, 3}));
  EXPECT_EQ(rs[3], (Range{9, 10}));
  const ShardPlan p = plan(c, 4, 3);
  EXPECT_EQ(p.vocab_per_rank, 3);
  EXPECT_EQ(p.vocab_padded, 12);
}

TEST(ShardPlan, FewerKvHeadsThanRanksReplicatesTheServingHead) {
  ModelConfig c = llama3_8b();
  c.heads = 8, c.kv_heads = 2;  // query heads 0-3 read KV head 0, 4-7 head 1
  for (int r = 0; r < 4; ++r) {
    const ShardPlan p = plan(c, 4, r);
    EXPECT_EQ(p.q_heads, (Range{2 * r, 2 * r + 2})) << r;
    EXPECT_EQ(p.kv_heads, (Range{r / 2, r / 2 + 1})) << r;
    EXPECT_EQ(p.kv_replicas, 2) << r;
    // The KV head serves this rank's query heads: kv = q / (heads / kv_heads).
    EXPECT_EQ(p.kv_heads.begin, p.q_heads.begin / 4) << r;
    EXPECT_EQ(p.kv_heads.begin, (p.q_heads.end - 1) / 4) << r;
    EXPECT_FALSE(p.mla_latent_replicated);
  }
  // Each extra copy of a KV head adds its wk and wv rows once.
  const int64_t H = c.hidden, kv_layer = 2 * c.head_dim * H;
  const int64_t replicated = H * (2 * c.layers + 1);
  EXPECT_EQ(params_over_ranks(c, 4, 1),
            full_weight_params(c) + 3 * replicated + c.layers * 2 * kv_layer);
}

TEST(ShardPlan, MlaReplicatesTheLatentOnEveryRank) {
  const ModelConfig c = deepseek_v3();
  for (int r = 0; r < 8; ++r) {
    const ShardPlan p = plan(c, 8, r, 8, r);
    EXPECT_EQ(p.q_heads, (Range{16 * r, 16 * r + 16})) << r;
    EXPECT_EQ(p.kv_heads, (Range{0, 1})) << r;
    EXPECT_EQ(p.kv_replicas, 8) << r;
    EXPECT_TRUE(p.mla_latent_replicated) << r;
    EXPECT_TRUE(p.attn_out_aligned) << r;  // 16 heads * v_head_dim 128
    EXPECT_EQ(p.experts, (Range{32 * r, 32 * r + 32})) << r;
  }
}

TEST(ShardPlan, AttentionOutputAlignment) {
  ModelConfig c = llama3_8b();
  c.heads = 14, c.kv_heads = 2, c.head_dim = 64;  // Qwen2.5-0.5B: 7 heads of 64 per rank at tp 2
  EXPECT_FALSE(plan(c, 2, 0).attn_out_aligned);
  c.heads = 16;
  EXPECT_TRUE(plan(c, 2, 0).attn_out_aligned);
}

// Summed over ranks, the plan holds the model once plus (ranks - 1) copies
// of what every rank repeats.
TEST(ShardPlan, ParamsOverRanksLlama) {
  const ModelConfig c = llama3_8b();
  const int64_t replicated = c.hidden * (2 * c.layers + 1);  // norms
  for (int tp : {1, 2, 4, 8})
    EXPECT_EQ(params_over_ranks(c, tp, 1), full_weight_params(c) + (tp - 1) * replicated) << tp;
  ModelConfig tied = c;
  tied.tie_embeddings = true;
  EXPECT_EQ(params_over_ranks(tied, 8, 1), full_weight_params(tied) + 7 * replicated);
}

TEST(ShardPlan, ParamsOverRanksQwen3Moe) {
  const ModelConfig c = qwen3_moe();
  const int64_t H = c.hidden;
  const int64_t replicated = H + c.layers * (2 * H + 2 * c.head_dim + c.n_experts * H);
  // EP over the TP ranks: experts whole, attention split.
  for (int w : {2, 4})
    EXPECT_EQ(params_over_ranks(c, w, w), full_weight_params(c) + (w - 1) * replicated) << w;
  // tp 2, ep 1: experts TP-split along moe_ffn (384 columns each).
  EXPECT_EQ(plan(c, 2, 1).moe_ffn, (Range{384, 768}));
  EXPECT_EQ(params_over_ranks(c, 2, 1), full_weight_params(c) + replicated);
  // tp 8 > kv_heads 4: each KV head on two ranks.
  const int64_t extra_kv = c.layers * 4 * 2 * c.head_dim * H;
  EXPECT_EQ(params_over_ranks(c, 8, 8), full_weight_params(c) + 7 * replicated + extra_kv);
  // Pure EP (tp 1): all but the routed experts repeated on every rank.
  const int64_t experts = c.layers * c.n_experts * 3 * c.moe_ffn * H;
  EXPECT_EQ(params_over_ranks(c, 1, 4), full_weight_params(c) + 3 * (full_weight_params(c) - experts));
}

TEST(ShardPlan, ParamsOverRanksDeepSeekV3) {
  ModelConfig c = deepseek_v3();
  const int64_t H = c.hidden, Q = c.q_lora_rank, R = c.kv_lora_rank;
  // Norms, q_a and its norm, kv_a and its norm; routers and their biases.
  const int64_t per_layer = 2 * H + Q * H + Q + (R + c.qk_rope_dim) * H + R;
  const int64_t replicated = H + c.layers * per_layer + 58 * (c.n_experts * H + c.n_experts);
  for (int w : {2, 8, 16})
    EXPECT_EQ(params_over_ranks(c, w, w), full_weight_params(c) + (w - 1) * replicated) << w;
  EXPECT_EQ(params_over_ranks(c, 8, 1), full_weight_params(c) + 7 * replicated);

  // GLM-5-style sparse attention: an indexer on every other layer, replicated.
  c.index_topk = 2048, c.index_heads = 32, c.index_head_dim = 128;
  c.index_full.assign(61, 0);
  for (size_t i = 0; i < 61; i += 2) c.index_full[i] = 1;
  const int64_t indexer = (c.index_head_dim + c.index_heads) * H +
                          c.index_heads * c.index_head_dim * Q + 2 * c.index_head_dim;
  EXPECT_EQ(full_weight_params(c), 671026419200 + 31 * indexer);
  EXPECT_EQ(params_over_ranks(c, 8, 8),
            full_weight_params(c) + 7 * (replicated + 31 * indexer));
}

// KV groups that do not divide evenly: SmolLM2-135M's 3 KV heads (9 query
// heads) over 2 ranks hold 2 and 1 groups; Llama 3 8B's 8 over 3 hold 3, 3, 2.
TEST(ShardPlan, UnevenKvGroups) {
  ModelConfig s = llama3_8b();
  s.heads = 9, s.kv_heads = 3, s.head_dim = 64, s.hidden = 576, s.ffn = 1536;
  const ShardPlan a = plan(s, 2, 0), b = plan(s, 2, 1);
  EXPECT_EQ(a.kv_heads, (Range{0, 2}));
  EXPECT_EQ(a.q_heads, (Range{0, 6}));
  EXPECT_EQ(b.kv_heads, (Range{2, 3}));
  EXPECT_EQ(b.q_heads, (Range{6, 9}));
  // o_proj input columns [0, 384) and [384, 576): 384 is 3 blocks of 128,
  // and the last piece may end off a block.
  EXPECT_TRUE(a.attn_out_aligned);
  EXPECT_TRUE(b.attn_out_aligned);
  const ModelConfig l = llama3_8b();
  int64_t kv = 0;
  for (int r = 0; r < 3; ++r) {
    const ShardPlan p = plan(l, 3, r);
    EXPECT_EQ(p.kv_heads.size(), r < 2 ? 3 : 2);
    EXPECT_EQ(p.q_heads.size(), 4 * p.kv_heads.size());
    EXPECT_EQ(p.kv_heads.begin, kv);
    kv = p.kv_heads.end;
  }
  EXPECT_EQ(kv, 8);
}

TEST(ShardPlan, Errors) {
  const ModelConfig l = llama3_8b();
  expect_error(l, 0, 0, 1, 0, "tp must be at least 1, got 0");
  expect_error(l, 1, 0, 0, 0, "ep must be at least 1, got 0");
  expect_error(l, 4, 4, 1, 0, "tp_rank 4 is out of range for tp 4 (0..3)");
  expect_error(l, 4, -1, 1, 0, "tp_rank -1 is out of range for tp 4 (0..3)");
  expect_error(qwen3_moe(), 4, 0, 4, 7, "ep_rank 7 is out of range for ep 4 (0..3)");
  expect_error(l, 2, 0, 1, 0, "align must be positive, got 0", 0);
  ModelConfig c = l;
  c.heads = 24, c.kv_heads = 4;
  expect_error(c, 6, 0, 1, 0,
               "kv_heads 4 and tp 6: with fewer KV heads than ranks, kv_heads must divide tp "
               "(each KV head replicated over tp/kv_heads ranks)");
  c.heads = 12, c.kv_heads = 2;
  expect_error(c, 8, 0, 1, 0,
               "heads 12 is not a multiple of tp 8 (with fewer KV heads than ranks, query heads "
               "split evenly)");
  c.heads = 10, c.kv_heads = 4;
  expect_error(c, 2, 0, 1, 0, "heads 10 is not a multiple of kv_heads 4");

  c = l;
  c.ffn = 11000;
  expect_error(c, 4, 0, 1, 0,
               "ffn 11000 cannot be split over 4 ranks in multiples of 128 (it is not a multiple "
               "of 128)");
  EXPECT_TRUE(make_shard_plan(c, 1, 0, 1, 0).ok()) << "one rank needs no alignment";
  c.ffn = 256;
  expect_error(c, 4, 0, 1, 0,
               "ffn 256 cannot be split over 4 ranks in multiples of 128 (only 2 blocks of 128 "
               "for 4 ranks)");

  ModelConfig d = deepseek_v3();
  d.moe_shared_ffn = 1000;
  expect_error(d, 2, 0, 2, 0,
               "moe_shared_ffn 1000 cannot be split over 2 ranks in multiples of 128 (it is not "
               "a multiple of 128)");
  // Six blocks of 128 split over 4 ranks (2, 2, 1, 1), not over 8.
  EXPECT_EQ(plan(qwen3_moe(), 4, 3).moe_ffn, (Range{640, 768}));
  expect_error(qwen3_moe(), 8, 0, 1, 0,
               "moe_ffn 768 cannot be split over 8 ranks in multiples of 128 (only 6 blocks of "
               "128 for 8 ranks); with ep > 1 experts are held whole instead");
}

TEST(ShardPlan, ExpertErrors) {
  expect_error(qwen3_moe(), 1, 0, 3, 0, "n_experts 128 is not a multiple of ep 3");
  expect_error(llama3_8b(), 2, 0, 2, 0, "ep 2 needs routed experts, and this model has none");
  ModelConfig c = llama3_8b();
  c.vocab = 0;
  expect_error(c, 1, 0, 1, 0, "vocab must be positive, got 0");
  c = llama3_8b();
  c.kv_heads = 0;
  expect_error(c, 1, 0, 1, 0, "kv_heads must be positive, got 0");
}

}  // namespace
}  // namespace kvant::dist
