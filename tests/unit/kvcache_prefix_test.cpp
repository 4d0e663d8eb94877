// PrefixIndex: longest-chain lookup over full pages, token confirmation (the
// same page of tokens under a different prefix never matches), reference
// counting of shared pages, LRU eviction tail-first, hit/miss counters,
// checksum verification on reuse, and that a page evicted and reallocated
// gets a new generation so a stale table entry fails verification.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kvcache/kv_verifier.h"
#include "kvcache/page_pool.h"
#include "kvcache/page_table.h"
#include "kvcache/prefix_index.h"

namespace kvant {
namespace {

constexpr int64_t kP = 4;  // page_tokens

std::unique_ptr<PagePool> make_pool(int64_t pages) {
  auto p = PagePool::create(
      {.geometry =
           {.layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = KvDType::kBf16, .page_tokens = kP},
       .num_pages = pages});
  EXPECT_TRUE(p.ok());
  return std::move(p.value());
}

std::vector<int32_t> seq(int32_t start, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A sequence that prefills `tokens` with whatever prefix the index has, then
// indexes its full pages.
PageTable prefill(PagePool& pool, PrefixIndex& index, const std::vector<int32_t>& tokens) {
  PageTable t;
  const int64_t hit = index.lookup(tokens, t.pages);
  t.tokens = hit * kP;
  EXPECT_TRUE(page_table_grow(pool, t, int64_t(tokens.size()) - t.tokens));
  index.insert(tokens, t.pages);
  return t;
}

std::vector<PageRef> holders(const std::vector<PageTable*>& tables, const PrefixIndex& index) {
  std::vector<PageRef> h;
  for (const PageTable* t : tables) h.insert(h.end(), t->pages.begin(), t->pages.end());
  index.collect_refs(h);
  return h;
}

TEST(KvPrefix, SharesLongestChainOfFullPages) {
  auto pool = make_pool(32);
  PrefixIndex index(*pool);
  const auto a_tokens = seq(0, 14);  // 3 full pages + 2
  PageTable a = prefill(*pool, index, a_tokens);
  EXPECT_EQ(index.size(), 3);
  EXPECT_EQ(pool->refcount(a.pages[0].page), 2u);  // a + index
  EXPECT_EQ(pool->refcount(a.pages[3].page), 1u);  // partial page: not indexed

  // b shares the first two pages, then diverges.
  auto b_tokens = seq(0, 8);
  for (int32_t x : seq(500, 7)) b_tokens.push_back(x);
  PageTable b;
  EXPECT_EQ(index.lookup(b_tokens, b.pages), 2);
  ASSERT_EQ(b.pages.size(), 2u);
  EXPECT_EQ(b.pages[0], a.pages[0]);
  EXPECT_EQ(b.pages[1], a.pages[1]);
  EXPECT_EQ(pool->refcount(a.pages[0].page), 3u);
  const PrefixStats& s = index.stats();
  EXPECT_EQ(s.hit_pages, 2u);
  EXPECT_EQ(s.miss_pages, 1u + 3u);  // a's first lookup missed 3; b's third page missed
  EXPECT_EQ(s.hit_tokens, 8u);
  EXPECT_EQ(s.miss_tokens, 14u + 7u);
  b.tokens = 8;
  ASSERT_TRUE(page_table_grow(*pool, b, 7));
  EXPECT_EQ(index.insert(b_tokens, b.pages), 1);  // only the new third page
  EXPECT_EQ(index.size(), 4);
  EXPECT_TRUE(pool->check_invariants(holders({&a, &b}, index)).ok());

  page_table_release(*pool, a);
  page_table_release(*pool, b);
  EXPECT_TRUE(pool->check_invariants(holders({}, index)).ok());
  index.clear();
  EXPECT_EQ(pool->free_pages(), 32);
  EXPECT_TRUE(pool->check_invariants({}).ok());
}

TEST(KvPrefix, SamePageUnderADifferentPrefixDoesNotMatch) {
  auto pool = make_pool(16);
  PrefixIndex index(*pool);
  auto x = seq(0, 4), y = seq(100, 4);
  std::vector<int32_t> xy = x, yy = y;
  xy.insert(xy.end(), y.begin(), y.end());  // [x][y]
  yy.insert(yy.end(), y.begin(), y.end());  // [y][y]
  PageTable a = prefill(*pool, index, xy);
  std::vector<PageRef> got;
  // [y] as a first page was never indexed, though [y] is indexed as a second.
  EXPECT_EQ(index.lookup(yy, got), 0);
  EXPECT_EQ(index.lookup(y, got), 0);
  // A page differing in one token misses.
  auto x2 = x;
  x2[3] = 99;
  EXPECT_EQ(index.lookup(x2, got), 0);
  // Shorter than a page: nothing to match, counted as missed tokens.
  EXPECT_EQ(index.lookup(seq(0, 3), got), 0);
  EXPECT_TRUE(got.empty());
  page_table_release(*pool, a);
  index.clear();
}

TEST(KvPrefix, EvictsLeastRecentlyUsedTailFirst) {
  auto pool = make_pool(8);
  PrefixIndex index(*pool);
  PageTable a = prefill(*pool, index, seq(0, 12));   // chain A: 3 pages
  PageTable b = prefill(*pool, index, seq(100, 8));  // chain B: 2 pages
  page_table_release(*pool, a);
  page_table_release(*pool, b);
  EXPECT_EQ(pool->free_pages(), 3);
  EXPECT_EQ(index.evictable_pages(), 5);
  // Touch chain A's head, making chain B the least recently used.
  std::vector<PageRef> tmp;
  ASSERT_EQ(index.lookup(seq(0, 4), tmp), 1);
  ASSERT_TRUE(pool->release(tmp[0]).ok());
  // A's pages 2 and 3 were stamped before B, A's head after; the order is
  // A3, A2, B2, B1, A1.
  const uint32_t a_head = tmp[0].page;
  EXPECT_EQ(index.evict_for(3), 3);
  EXPECT_EQ(index.size(), 2);
  std::vector<PageRef> again;
  EXPECT_EQ(index.lookup(seq(100, 8), again), 1);  // B's head survived
  for (const PageRef& r : again) ASSERT_TRUE(pool->release(r).ok());
  again.clear();
  EXPECT_EQ(index.lookup(seq(0, 12), again), 1);  // A lost its tail
  EXPECT_EQ(again[0].page, a_head);
  // Pages still held by a sequence are never evicted, nor their ancestors.
  EXPECT_EQ(index.evict_for(10), 1);  // only B's head
  EXPECT_EQ(index.size(), 1);
  EXPECT_EQ(index.evictable_pages(), 0);
  ASSERT_TRUE(pool->release(again[0]).ok());
  EXPECT_EQ(index.evict_for(10), 1);
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(pool->free_pages(), 8);
  EXPECT_EQ(index.stats().evicted_pages, 5u);
}

TEST(KvPrefix, ParentWithABusyChildIsNotEvictable) {
  auto pool = make_pool(8);
  PrefixIndex index(*pool);
  PageTable a = prefill(*pool, index, seq(0, 8));
  // A second sequence holds only the tail page (as a forked copy might).
  PageTable tail;
  tail.pages.push_back(a.pages[1]);
  ASSERT_TRUE(pool->retain(a.pages[1]).ok());
  page_table_release(*pool, a);
  EXPECT_EQ(index.evictable_pages(), 0);
  EXPECT_EQ(index.evict_for(2), 0);
  page_table_release(*pool, tail);
  EXPECT_EQ(index.evictable_pages(), 2);
  EXPECT_EQ(index.evict_for(2), 2);
}

TEST(KvPrefix, EvictedPageReallocatedGetsNewGenerationAndStaleEntryFailsVerify) {
  auto pool = make_pool(4);
  PrefixIndex index(*pool);
  PageTable a = prefill(*pool, index, seq(0, 8));
  const PageRef shared = a.pages[0];
  // A buggy holder that kept a's ref after releasing it.
  const std::vector<PageRef> kept = a.pages;
  page_table_release(*pool, a);
  // The prefix-shared page keeps its generation while the index holds it.
  EXPECT_EQ(pool->generation(shared.page), shared.generation);
  EXPECT_EQ(index.evict_for(2), 2);
  PageTable b;
  ASSERT_TRUE(page_table_grow(*pool, b, 16));  // takes every page, the evicted ones too
  KvVerifier v(*pool);
  std::vector<VerifyFailure> out;
  const VerifyItem stale{42, kept};
  EXPECT_EQ(v.verify({&stale, 1}, out), 2u);
  EXPECT_EQ(out[0].fault, VerifyFault::kStaleGeneration);
  EXPECT_NE(out[0].actual_generation, out[0].expected_generation);
  const VerifyItem fresh{43, b.pages};
  out.clear();
  EXPECT_EQ(v.verify({&fresh, 1}, out), 0u);
}

TEST(KvPrefix, ChecksumMismatchDropsThePageOnReuse) {
  auto pool = make_pool(8);
  PrefixIndex index(*pool, {.verify_checksums = true});
  const auto tokens = seq(0, 8);
  PageTable a;
  ASSERT_TRUE(page_table_grow(*pool, a, 8));
  std::vector<float> row(16, 0.25f);
  for (int64_t pos = 0; pos < 8; ++pos) {
    const KvSlot s = page_table_locate(a, pos, kP);
    pool->write_token(s.ref.page, s.slot, 0, row.data(), row.data());
  }
  index.insert(tokens, a.pages);
  EXPECT_TRUE(pool->sealed(a.pages[0].page));
  EXPECT_TRUE(pool->sealed(a.pages[1].page));
  const uint32_t second = a.pages[1].page;
  page_table_release(*pool, a);
  // Corrupt the second page's bytes behind everyone's back.
  pool->page_data(second)[3] ^= 1;
  PageTable b;
  EXPECT_EQ(index.lookup(tokens, b.pages), 1);
  EXPECT_EQ(index.stats().checksum_failures, 1u);
  EXPECT_EQ(index.size(), 1);
  page_table_release(*pool, b);
  EXPECT_TRUE(pool->check_invariants(holders({}, index)).ok());
  index.clear();
  EXPECT_EQ(pool->free_pages(), 8);
}

TEST(KvPrefix, StaleIndexEntryIsDroppedNotReused) {
  auto pool = make_pool(4);
  PrefixIndex index(*pool);
  PageTable a = prefill(*pool, index, seq(0, 4));
  page_table_release(*pool, a);
  // Simulate a bug that frees the index's page (refcount 1 -> 0).
  std::vector<PageRef> refs;
  index.collect_refs(refs);
  ASSERT_TRUE(pool->release(refs[0]).ok());
  EXPECT_FALSE(pool->check_invariants(holders({}, index)).ok());
  std::vector<PageRef> got;
  EXPECT_EQ(index.lookup(seq(0, 4), got), 0);
  EXPECT_EQ(index.stats().stale_dropped, 1u);
  EXPECT_EQ(index.size(), 0);
  EXPECT_TRUE(pool->check_invariants(holders({}, index)).ok());
}

}  // namespace
}  // namespace kvant
