// PagePool: allocation, reference counts and generations (unique, never 0,
// changed on every allocation), the errors for double free / stale / bad ids,
// the invariant checker and repair, token write/read in every dtype and scale
// mode against the scalar codec, MLA shared rows, XXH3 checksums, and the
// page-table helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "kvcache/kv_codec.h"
#include "kvcache/page_pool.h"
#include "kvcache/page_table.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"

namespace kvant {
namespace {

std::unique_ptr<PagePool> make_pool(KvGeometry g, int64_t pages, std::vector<float> ks = {},
                                    std::vector<float> vs = {}) {
  auto p = PagePool::create({.geometry = g,
                             .num_pages = pages,
                             .static_k_scales = std::move(ks),
                             .static_v_scales = std::move(vs)});
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return p.ok() ? std::move(p.value()) : nullptr;
}

KvGeometry small(KvDType d = KvDType::kBf16, KvScaleMode m = KvScaleMode::kNone) {
  return KvGeometry{
      .layers = 2, .kv_heads = 2, .head_dim = 16, .dtype = d, .page_tokens = 4, .scale_mode = m};
}

bool has(const Result<void>& r, const char* text) {
  return !r.ok() && r.error().message.find(text) != std::string::npos;
}

TEST(KvPool, AllocateGivesFreshNonZeroGenerations) {
  auto pool = make_pool(small(), 8);
  EXPECT_EQ(pool->free_pages(), 8);
  std::set<uint32_t> gens;
  std::vector<PageRef> refs;
  for (int i = 0; i < 8; ++i) {
    auto r = pool->allocate();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->page, uint32_t(i));  // low ids first
    EXPECT_NE(r->generation, kFreeGeneration);
    EXPECT_EQ(pool->generation(r->page), r->generation);
    EXPECT_EQ(pool->refcount(r->page), 1u);
    gens.insert(r->generation);
    refs.push_back(*r);
  }
  EXPECT_FALSE(pool->allocate().has_value());
  EXPECT_EQ(pool->used_pages(), 8);
  // Reallocating the same physical page always changes its generation.
  for (int round = 0; round < 100; ++round) {
    const PageRef old = refs[size_t(round % 8)];
    ASSERT_TRUE(pool->release(old).ok());
    EXPECT_EQ(pool->generation(old.page), kFreeGeneration);
    auto again = pool->allocate();
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->page, old.page);
    EXPECT_NE(again->generation, old.generation);
    EXPECT_TRUE(gens.insert(again->generation).second) << "generation reused";
    refs[size_t(round % 8)] = *again;
  }
  EXPECT_EQ(pool->stats().allocations, 108u);
}

TEST(KvPool, RefcountsAndErrors) {
  auto pool = make_pool(small(), 4);
  const PageRef a = *pool->allocate();
  ASSERT_TRUE(pool->retain(a).ok());
  EXPECT_EQ(pool->refcount(a.page), 2u);
  ASSERT_TRUE(pool->release(a).ok());
  EXPECT_EQ(pool->free_pages(), 3);  // still held once
  ASSERT_TRUE(pool->release(a).ok());
  EXPECT_EQ(pool->free_pages(), 4);
  // Double free / release of a free page.
  EXPECT_TRUE(has(pool->release(a), "is free"));
  EXPECT_TRUE(has(pool->retain(a), "is free"));
  // Stale reference after reallocation: the new holder is untouched.
  const PageRef b = *pool->allocate();
  ASSERT_EQ(b.page, a.page);
  auto stale = pool->release(a);
  EXPECT_TRUE(has(stale, "stale reference to page"));
  EXPECT_NE(stale.error().message.find(std::to_string(b.generation)), std::string::npos);
  EXPECT_EQ(pool->refcount(b.page), 1u);
  // Bad id, generation 0.
  EXPECT_TRUE(has(pool->release(PageRef{99, b.generation}), "out of range"));
  EXPECT_TRUE(has(pool->release(PageRef{b.page, 0}), "stale"));
  EXPECT_EQ(pool->stats().release_errors, 4u);
  EXPECT_EQ(pool->refcount(b.page), 1u);
  EXPECT_TRUE(pool->check_invariants(std::vector<PageRef>{b}).ok());
}

TEST(KvPool, InvariantCheckerComparesHoldersWithRefcounts) {
  auto pool = make_pool(small(), 6);
  const PageRef a = *pool->allocate(), b = *pool->allocate(), c = *pool->allocate();
  ASSERT_TRUE(pool->retain(b).ok());
  std::vector<PageRef> holders{a, b, b, c};
  EXPECT_TRUE(pool->check_invariants(holders).ok());

  std::vector<uint32_t> bad;
  // A holder the pool does not know of (refcount 2, three holders).
  holders.push_back(b);
  auto r = pool->check_invariants(holders, &bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("page 1 refcount 2 but 3 holders"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(bad, std::vector<uint32_t>{1});
  holders.pop_back();

  // A missing holder (a leak), and a stale holder.
  const std::vector<PageRef> leaky{a, b, b, PageRef{c.page, c.generation + 7}};
  r = pool->check_invariants(leaky, &bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("expects generation"), std::string::npos);
  EXPECT_EQ(bad, std::vector<uint32_t>{2});

  // repair() trusts the holders: the leaked page 2 is freed, b keeps 2 refs.
  EXPECT_EQ(pool->repair(leaky), 1);
  EXPECT_EQ(pool->generation(c.page), kFreeGeneration);
  EXPECT_TRUE(pool->check_invariants(std::vector<PageRef>{a, b, b}).ok());
  EXPECT_EQ(pool->free_pages(), 4);
  // The free list still works after the rebuild.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pool->allocate().has_value());
  EXPECT_FALSE(pool->allocate().has_value());
}

// Every element of the page equals the scalar codec applied to the input.
void expect_round_trip(const KvGeometry& g, std::vector<float> ks = {},
                       std::vector<float> vs = {}) {
  auto pool = make_pool(g, 3, ks, vs);
  ASSERT_NE(pool, nullptr);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t row = g.kv_heads * g.head_dim;
  const PageRef p = *pool->allocate();
  std::vector<std::vector<float>> k(size_t(g.layers * g.page_tokens)), v(k.size());
  for (int64_t l = 0; l < g.layers; ++l)
    for (int64_t s = 0; s < g.page_tokens; ++s) {
      auto& kr = k[size_t(l * g.page_tokens + s)];
      auto& vr = v[size_t(l * g.page_tokens + s)];
      kr.resize(size_t(row));
      vr.resize(size_t(row));
      for (auto& x : kr) x = nd(rng) * float(1 + s);
      for (auto& x : vr) x = nd(rng) * 0.01f;
      if (s == 1) std::fill(kr.begin(), kr.end(), 0.0f);  // an all-zero row
      pool->write_token(p.page, s, l, kr.data(), g.shared_kv ? nullptr : vr.data());
    }
  const size_t n = static_cast<size_t>(row);
  std::vector<float> ko(n), vo(n), want(n);
  std::vector<uint8_t> enc(n * 2);
  for (int64_t l = 0; l < g.layers; ++l)
    for (int64_t s = 0; s < g.page_tokens; ++s) {
      pool->read_token(p.page, s, l, ko.data(), vo.data());
      for (int stream = 0; stream < 2; ++stream) {
        const auto& in = (stream == 0 || g.shared_kv) ? k[size_t(l * g.page_tokens + s)]
                                                      : v[size_t(l * g.page_tokens + s)];
        const auto& got = stream == 0 ? ko : vo;
        for (int64_t h = 0; h < g.kv_heads; ++h) {
          const float* x = in.data() + h * g.head_dim;
          float scale = 1.0f;
          if (g.scale_mode == KvScaleMode::kDynamic) {
            scale = kv_dynamic_scale(g.dtype, x, g.head_dim);
            const uint16_t* stored =
                stream == 0 ? pool->k_scales(p.page, l) : pool->v_scales(p.page, l);
            EXPECT_EQ(bf16_to_f32(stored[s * g.kv_heads + h]), scale);
            const bool zero_row = s == 1 && (stream == 0 || g.shared_kv);
            if (!zero_row) {
              float amax = 0;
              for (int64_t i = 0; i < g.head_dim; ++i) amax = std::max(amax, std::fabs(x[i]));
              // amax / max_finite rounded up to BF16: at most 2^-7 above.
              const float exact = amax / kv_dtype_max_finite(g.dtype);
              EXPECT_GE(scale, exact);
              EXPECT_LE(scale, exact * (1.0f + 1.0f / 128));
              EXPECT_EQ(f32_to_bf16(scale), f32_to_bf16(scale) & 0xffff);
              EXPECT_EQ(bf16_to_f32(f32_to_bf16(scale)), scale);
            } else {
              EXPECT_EQ(scale, 1.0f);
            }
          } else if (g.scale_mode == KvScaleMode::kStatic) {
            scale = (stream == 0 ? pool->static_k_scales(l) : pool->static_v_scales(l))[h];
          }
          kv_encode_row(g.dtype, x, g.head_dim, scale, enc.data());
          kv_decode_row(g.dtype, enc.data(), g.head_dim, scale, want.data());
          for (int64_t i = 0; i < g.head_dim; ++i) {
            ASSERT_EQ(got[size_t(h * g.head_dim + i)], want[size_t(i)])
                << "layer " << l << " slot " << s << " stream " << stream << " head " << h;
            // Independent error bound: half an ulp of the format's mantissa,
            // relative to the value, or a subnormal step of the scale.
            const float rel = g.dtype == KvDType::kBf16      ? 1.0f / 256
                              : g.dtype == KvDType::kFp8E4m3 ? 1.0f / 16
                                                             : 1.0f / 8;
            const float sub = g.dtype == KvDType::kFp8E4m3 ? 0x1p-10f : 0x1p-17f;
            const float tol = std::max(std::fabs(x[i]) * rel, scale * sub) * 1.0001f;
            const bool saturated =
                g.scale_mode == KvScaleMode::kStatic && std::fabs(x[i] / scale) > 400.0f;
            if (!saturated) {
              EXPECT_LE(std::fabs(got[size_t(h * g.head_dim + i)] - x[i]), tol);
            }
          }
        }
      }
    }
}

TEST(KvPool, RoundTripBf16) { expect_round_trip(small()); }
TEST(KvPool, RoundTripFp8Dynamic) {
  expect_round_trip(small(KvDType::kFp8E4m3, KvScaleMode::kDynamic));
  expect_round_trip(small(KvDType::kFp8E5m2, KvScaleMode::kDynamic));
}
TEST(KvPool, RoundTripFp8StaticPerLayerAndPerHead) {
  expect_round_trip(small(KvDType::kFp8E4m3, KvScaleMode::kStatic), {0.05f, 0.1f}, {1e-4f, 2e-4f});
  expect_round_trip(small(KvDType::kFp8E5m2, KvScaleMode::kStatic), {0.05f, 0.1f, 0.2f, 0.4f},
                    {1e-4f, 2e-4f, 3e-4f, 4e-4f});
}
TEST(KvPool, RoundTripMlaSharedRow) {
  KvGeometry g{.layers = 2,
               .kv_heads = 1,
               .head_dim = 512 + 64,
               .dtype = KvDType::kFp8E4m3,
               .page_tokens = 2,
               .scale_mode = KvScaleMode::kDynamic,
               .shared_kv = true};
  expect_round_trip(g);
  g.scale_mode = KvScaleMode::kStatic;
  expect_round_trip(g, {0.02f, 0.03f});
  g.dtype = KvDType::kBf16;
  g.scale_mode = KvScaleMode::kNone;
  expect_round_trip(g);
}

TEST(KvPool, MlaVReadsTheKBlock) {
  const KvGeometry g{.layers = 3,
                     .kv_heads = 1,
                     .head_dim = 576,
                     .dtype = KvDType::kFp8E4m3,
                     .page_tokens = 16,
                     .scale_mode = KvScaleMode::kDynamic,
                     .shared_kv = true};
  auto pool = make_pool(g, 2);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(pool->k_data(1, l), pool->v_data(1, l));
    EXPECT_EQ(pool->k_scales(1, l), pool->v_scales(1, l));
    EXPECT_EQ(static_cast<uint8_t*>(pool->k_data(1, l)) - pool->page_data(1), l * (16 * 576 + 64));
  }
}

TEST(KvPool, BlockPointersFollowTheLayout) {
  auto pool = make_pool(small(KvDType::kFp8E4m3, KvScaleMode::kDynamic), 3);
  const KvLayout& l = pool->layout();
  uint8_t* base = pool->page_data(0);
  for (uint32_t p = 0; p < 3; ++p)
    for (int64_t layer = 0; layer < 2; ++layer) {
      const int64_t at = int64_t(p) * l.page_bytes + layer * l.layer_bytes;
      EXPECT_EQ(static_cast<uint8_t*>(pool->k_data(p, layer)) - base, at + l.k_offset);
      EXPECT_EQ(static_cast<uint8_t*>(pool->v_data(p, layer)) - base, at + l.v_offset);
      EXPECT_EQ(reinterpret_cast<uint8_t*>(pool->k_scales(p, layer)) - base, at + l.k_scale_offset);
      EXPECT_EQ(reinterpret_cast<uint8_t*>(pool->v_scales(p, layer)) - base, at + l.v_scale_offset);
    }
  auto bf = make_pool(small(), 1);
  EXPECT_EQ(bf->k_scales(0, 0), nullptr);
  EXPECT_EQ(bf->static_k_scales(0), nullptr);
}

TEST(KvPool, ChecksumsDetectChangedContent) {
  auto pool = make_pool(small(KvDType::kFp8E4m3, KvScaleMode::kDynamic), 2);
  const PageRef p = *pool->allocate();
  std::vector<float> row(32, 1.5f);
  for (int64_t s = 0; s < 4; ++s) pool->write_token(p.page, s, 0, row.data(), row.data());
  EXPECT_FALSE(pool->verify_checksum(p.page).ok());  // not sealed yet
  ASSERT_TRUE(pool->seal(p.page).ok());
  EXPECT_TRUE(pool->sealed(p.page));
  EXPECT_TRUE(pool->verify_checksum(p.page).ok());
  // One flipped bit anywhere in the page, scales included, is caught.
  for (int64_t off : {int64_t(0), pool->layout().k_scale_offset + 5, pool->page_bytes() - 1}) {
    pool->page_data(p.page)[off] ^= 0x10;
    auto r = pool->verify_checksum(p.page);
    EXPECT_TRUE(has(r, "content changed")) << off;
    pool->page_data(p.page)[off] ^= 0x10;
    EXPECT_TRUE(pool->verify_checksum(p.page).ok());
  }
  // Freeing unseals.
  ASSERT_TRUE(pool->release(p).ok());
  EXPECT_FALSE(pool->sealed(p.page));
  EXPECT_FALSE(pool->seal(p.page).ok());
}

TEST(KvPageTable, GrowLocateRelease) {
  auto pool = make_pool(small(), 5);
  PageTable t;
  EXPECT_EQ(page_table_pages_needed(t, 9, 4), 3);
  ASSERT_TRUE(page_table_grow(*pool, t, 9));
  EXPECT_EQ(t.tokens, 9);
  EXPECT_EQ(t.pages.size(), 3u);
  EXPECT_EQ(page_table_pages_needed(t, 3, 4), 0);
  ASSERT_TRUE(page_table_grow(*pool, t, 3));
  EXPECT_EQ(t.pages.size(), 3u);
  const KvSlot s = page_table_locate(t, 9, 4);
  EXPECT_EQ(s.ref, t.pages[2]);
  EXPECT_EQ(s.slot, 1);
  // All or nothing: 9 more tokens need 3 pages, only 2 are free.
  EXPECT_FALSE(page_table_grow(*pool, t, 9));
  EXPECT_EQ(t.tokens, 12);
  EXPECT_EQ(pool->free_pages(), 2);
  // A stale entry is rejected, not freed from under its new owner.
  PageTable other;
  ASSERT_TRUE(page_table_grow(*pool, other, 1));
  const PageRef stolen = t.pages[0];
  ASSERT_TRUE(pool->release(stolen).ok());
  const PageRef now = *pool->allocate();
  ASSERT_EQ(now.page, stolen.page);
  const ReleaseCounts c = page_table_release(*pool, t);
  EXPECT_EQ(c.released, 2);
  EXPECT_EQ(c.rejected, 1);
  EXPECT_TRUE(t.pages.empty());
  EXPECT_EQ(t.tokens, 0);
  EXPECT_EQ(pool->refcount(now.page), 1u);
  std::vector<PageRef> holders = other.pages;
  holders.push_back(now);
  EXPECT_TRUE(pool->check_invariants(holders).ok());
}

}  // namespace
}  // namespace kvant
