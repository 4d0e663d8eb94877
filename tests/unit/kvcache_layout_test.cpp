// KV page layout and capacity arithmetic: exact offsets and sizes for real
// model shapes (SmolLM2-135M, Kimi K2 MLA), 64-byte alignment of every block,
// padding, the FP8-vs-BF16 capacity ratio in one byte budget, and the geometry
// errors. No page memory beyond a few small pools.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>

#include "kvcache/kv_layout.h"
#include "kvcache/page_pool.h"

namespace kvant {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

KvGeometry smollm2(KvDType d, KvScaleMode m) {
  return KvGeometry{
      .layers = 30, .kv_heads = 3, .head_dim = 64, .dtype = d, .page_tokens = 16, .scale_mode = m};
}
KvGeometry kimi_k2(KvDType d, KvScaleMode m) {
  return KvGeometry{.layers = 61,
                    .kv_heads = 1,
                    .head_dim = 512 + 64,
                    .dtype = d,
                    .page_tokens = 16,
                    .scale_mode = m,
                    .shared_kv = true};
}

KvLayout layout_of(const KvGeometry& g) {
  auto l = make_kv_layout(g);
  EXPECT_TRUE(l.ok()) << (l.ok() ? "" : l.error().message);
  return l.ok() ? *l : KvLayout{};
}

TEST(KvLayout, Bf16SmolLM2) {
  const KvLayout l = layout_of(smollm2(KvDType::kBf16, KvScaleMode::kNone));
  EXPECT_EQ(l.elem_bytes, 2);
  EXPECT_EQ(l.row_elems, 192);
  EXPECT_EQ(l.data_block_bytes, 16 * 3 * 64 * 2);  // 6144
  EXPECT_EQ(l.scale_block_bytes, 0);
  EXPECT_EQ(l.k_offset, 0);
  EXPECT_EQ(l.v_offset, 6144);
  EXPECT_EQ(l.layer_bytes, 12288);
  EXPECT_EQ(l.page_bytes, 30 * 12288);
  EXPECT_EQ(l.payload_bytes_per_token, 30 * 2 * 192 * 2);  // 23040
  EXPECT_EQ(kv_bytes_per_token(l), 23040.0);
}

TEST(KvLayout, Fp8StaticSmolLM2) {
  const KvLayout l = layout_of(smollm2(KvDType::kFp8E4m3, KvScaleMode::kStatic));
  EXPECT_EQ(l.data_block_bytes, 3072);
  EXPECT_EQ(l.v_offset, 3072);
  EXPECT_EQ(l.scale_block_bytes, 0);
  EXPECT_EQ(l.page_bytes, 30 * 6144);
  EXPECT_EQ(l.payload_bytes_per_token, 11520);
  EXPECT_EQ(kv_bytes_per_token(l), 11520.0);
}

TEST(KvLayout, Fp8DynamicSmolLM2CountsScales) {
  const KvLayout l = layout_of(smollm2(KvDType::kFp8E5m2, KvScaleMode::kDynamic));
  EXPECT_EQ(l.data_block_bytes, 3072);
  EXPECT_EQ(l.scale_block_bytes, 128);  // 16 * 3 BF16 = 96 bytes, padded to 64
  EXPECT_EQ(l.k_offset, 0);
  EXPECT_EQ(l.v_offset, 3072);
  EXPECT_EQ(l.k_scale_offset, 6144);
  EXPECT_EQ(l.v_scale_offset, 6144 + 128);
  EXPECT_EQ(l.layer_bytes, 2 * (3072 + 128));
  EXPECT_EQ(l.payload_bytes_per_token, 30 * 2 * (192 + 3 * 2));  // 11880
  EXPECT_EQ(kv_bytes_per_token(l), 12000.0);                      // scale blocks padded
}

TEST(KvLayout, MlaSharedRowStoredOnce) {
  const KvLayout b = layout_of(kimi_k2(KvDType::kBf16, KvScaleMode::kNone));
  EXPECT_EQ(b.v_offset, b.k_offset);
  EXPECT_EQ(b.layer_bytes, 16 * 576 * 2);
  EXPECT_EQ(b.payload_bytes_per_token, 61 * 576 * 2);  // 70272
  const KvLayout d = layout_of(kimi_k2(KvDType::kFp8E4m3, KvScaleMode::kDynamic));
  EXPECT_EQ(d.data_block_bytes, 16 * 576);
  EXPECT_EQ(d.scale_block_bytes, 64);
  EXPECT_EQ(d.k_scale_offset, 16 * 576);
  EXPECT_EQ(d.v_scale_offset, d.k_scale_offset);
  EXPECT_EQ(d.layer_bytes, 16 * 576 + 64);
  EXPECT_EQ(d.payload_bytes_per_token, 61 * (576 + 2));  // 35258
  EXPECT_EQ(d.page_bytes, 61 * (16 * 576 + 64));
}

TEST(KvLayout, BlocksAre64ByteAlignedWithPaddingCounted) {
  // One token of 8 BF16 values is 16 bytes; every block is padded to 64.
  const KvGeometry g{.layers = 3,
                     .kv_heads = 1,
                     .head_dim = 8,
                     .dtype = KvDType::kFp8E4m3,
                     .page_tokens = 3,
                     .scale_mode = KvScaleMode::kDynamic};
  const KvLayout l = layout_of(g);
  EXPECT_EQ(l.data_block_bytes, 64);   // 24 bytes of data
  EXPECT_EQ(l.scale_block_bytes, 64);  // 6 bytes of scales
  EXPECT_EQ(l.layer_bytes, 256);
  EXPECT_EQ(l.page_bytes, 768);
  EXPECT_EQ(l.payload_bytes_per_token, 3 * 2 * (8 + 2));
  EXPECT_EQ(kv_bytes_per_token(l), 256.0);  // padding included
  for (int64_t off : {l.k_offset, l.v_offset, l.k_scale_offset, l.v_scale_offset, l.layer_bytes})
    EXPECT_EQ(off % kKvBlockAlign, 0) << off;
}

TEST(KvLayout, Fp8HoldsAtLeast1point9TimesBf16InTheSameBudget) {
  struct Case {
    const char* name;
    KvGeometry (*make)(KvDType, KvScaleMode);
  };
  for (const Case& c : {Case{"smollm2-135m", smollm2}, Case{"kimi-k2", kimi_k2}}) {
    const int64_t budget = 2 * kGiB;
    const KvLayout bf = layout_of(c.make(KvDType::kBf16, KvScaleMode::kNone));
    const KvLayout st = layout_of(c.make(KvDType::kFp8E4m3, KvScaleMode::kStatic));
    const KvLayout dy = layout_of(c.make(KvDType::kFp8E4m3, KvScaleMode::kDynamic));
    const int64_t pt = bf.geometry.page_tokens;
    const int64_t t_bf = kv_pages_for_budget(bf, budget) * pt;
    const int64_t t_st = kv_pages_for_budget(st, budget) * pt;
    const int64_t t_dy = kv_pages_for_budget(dy, budget) * pt;
    std::printf(
        "[kv capacity] %s, 2 GiB: bf16 %lld tokens (%.0f B/token), fp8 static %lld (%.0f), "
        "fp8 dynamic %lld (%.0f), ratios %.3f / %.3f\n",
        c.name, (long long)t_bf, kv_bytes_per_token(bf), (long long)t_st, kv_bytes_per_token(st),
        (long long)t_dy, kv_bytes_per_token(dy), double(t_st) / double(t_bf),
        double(t_dy) / double(t_bf));
    EXPECT_GE(double(t_st), 1.9 * double(t_bf)) << c.name;
    EXPECT_GE(double(t_dy), 1.9 * double(t_bf)) << c.name;  // BF16 scales keep dynamic above 1.9x
    EXPECT_LT(t_dy, t_st) << c.name;  // scale bytes are counted
  }
  // Exact figures for SmolLM2-135M (30 layers, 3 KV heads, head_dim 64).
  EXPECT_EQ(kv_pages_for_budget(layout_of(smollm2(KvDType::kBf16, KvScaleMode::kNone)), 2 * kGiB),
            5825);  // 2^31 / 368640
  EXPECT_EQ(
      kv_pages_for_budget(layout_of(smollm2(KvDType::kFp8E4m3, KvScaleMode::kStatic)), 2 * kGiB),
      11650);  // 2^31 / 184320
  EXPECT_EQ(
      kv_pages_for_budget(layout_of(smollm2(KvDType::kFp8E4m3, KvScaleMode::kDynamic)), 2 * kGiB),
      11184);  // 2^31 / 192000: 178,944 tokens, 1.92x BF16
}

TEST(KvLayout, PoolCapacityMatchesLayoutArithmetic) {
  const int64_t budget = 8 << 20;
  for (KvScaleMode m : {KvScaleMode::kStatic, KvScaleMode::kDynamic}) {
    PagePoolOptions o{.geometry = smollm2(KvDType::kFp8E4m3, m), .memory_bytes = budget};
    if (m == KvScaleMode::kStatic) {
      o.static_k_scales.assign(30, 0.5f);
      o.static_v_scales.assign(30, 0.25f);
    }
    auto pool = PagePool::create(o);
    ASSERT_TRUE(pool.ok()) << pool.error().message;
    const KvLayout l = layout_of(o.geometry);
    EXPECT_EQ((*pool)->num_pages(), budget / l.page_bytes);
    EXPECT_EQ((*pool)->capacity_tokens(), budget / l.page_bytes * 16);
    EXPECT_EQ((*pool)->arena_bytes(), budget / l.page_bytes * l.page_bytes);
    EXPECT_LE((*pool)->arena_bytes(), budget);
    EXPECT_EQ((*pool)->bytes_per_token(), kv_bytes_per_token(l));
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->page_data(0)) % 64, 0u);
  }
}

TEST(KvLayout, RejectsBadGeometry) {
  auto bad = [](KvGeometry g) {
    auto l = make_kv_layout(g);
    EXPECT_FALSE(l.ok());
    return l.ok() ? std::string() : l.error().message;
  };
  KvGeometry g = smollm2(KvDType::kBf16, KvScaleMode::kNone);
  g.layers = 0;
  EXPECT_NE(bad(g).find("layers"), std::string::npos);
  g = smollm2(KvDType::kBf16, KvScaleMode::kNone);
  g.page_tokens = -4;
  bad(g);
  EXPECT_NE(bad(smollm2(KvDType::kBf16, KvScaleMode::kDynamic)).find("bf16"), std::string::npos);
  EXPECT_NE(bad(smollm2(KvDType::kFp8E4m3, KvScaleMode::kNone)).find("static or dynamic"),
            std::string::npos);
  g = smollm2(KvDType::kBf16, KvScaleMode::kNone);
  g.page_tokens = 1 << 20;
  EXPECT_NE(bad(g).find("2^34"), std::string::npos);
}

TEST(KvLayout, PoolRejectsBadOptions) {
  auto err = [](const PagePoolOptions& o) {
    auto p = PagePool::create(o);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.error().message;
  };
  const KvGeometry st = smollm2(KvDType::kFp8E4m3, KvScaleMode::kStatic);
  EXPECT_NE(err({.geometry = smollm2(KvDType::kBf16, KvScaleMode::kNone), .memory_bytes = 1000})
                .find("holds no page"),
            std::string::npos);
  PagePoolOptions o{.geometry = st, .num_pages = 4};
  o.static_k_scales.assign(7, 1.0f);
  o.static_v_scales.assign(30, 1.0f);
  EXPECT_NE(err(o).find("expected 30"), std::string::npos);
  o.static_k_scales.assign(90, 1.0f);
  o.static_k_scales[17] = -1.0f;
  EXPECT_NE(err(o).find("scale 17"), std::string::npos);
  PagePoolOptions mla{.geometry = kimi_k2(KvDType::kFp8E4m3, KvScaleMode::kStatic), .num_pages = 2};
  mla.static_k_scales.assign(61, 1.0f);
  mla.static_v_scales.assign(61, 1.0f);
  EXPECT_NE(err(mla).find("shared_kv"), std::string::npos);
  PagePoolOptions dyn{.geometry = smollm2(KvDType::kFp8E4m3, KvScaleMode::kDynamic),
                      .num_pages = 2};
  dyn.static_k_scales.assign(30, 1.0f);
  EXPECT_NE(err(dyn).find("scale mode dynamic"), std::string::npos);
}

}  // namespace
}  // namespace kvant
