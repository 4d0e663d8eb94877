// KvVerifier: the batched per-step generation check. Clean tables pass;
// stale, freed, out-of-range and generation-0 entries are each reported with
// the sequence, entry, page and both generations; counters add up. The last
// test is a micro-benchmark that prints ns per page ref (figures, not
// assertions).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "kvcache/kv_verifier.h"
#include "kvcache/page_pool.h"
#include "kvcache/page_table.h"

namespace kvant {
namespace {

std::unique_ptr<PagePool> make_pool(int64_t pages) {
  auto p = PagePool::create(
      {.geometry =
           {.layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = KvDType::kBf16, .page_tokens = 4},
       .num_pages = pages});
  EXPECT_TRUE(p.ok());
  return std::move(p.value());
}

TEST(KvVerify, CleanTablesPass) {
  auto pool = make_pool(32);
  std::vector<PageTable> tables(4);
  for (auto& t : tables) ASSERT_TRUE(page_table_grow(*pool, t, 17));
  std::vector<VerifyItem> items;
  for (size_t i = 0; i < tables.size(); ++i) items.push_back({100 + i, tables[i].pages});
  KvVerifier v(*pool);
  std::vector<VerifyFailure> out;
  EXPECT_EQ(v.verify(items, out), 0u);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(v.stats().passes, 1u);
  EXPECT_EQ(v.stats().checks, 4u * 5u);
  EXPECT_EQ(v.stats().violations, 0u);
}

TEST(KvVerify, ReportsEachKindOfBadEntry) {
  auto pool = make_pool(16);
  PageTable a, b;
  ASSERT_TRUE(page_table_grow(*pool, a, 16));  // pages 0..3
  ASSERT_TRUE(page_table_grow(*pool, b, 8));   // pages 4..5
  const PageRef old = a.pages[1];
  // Page 1 freed and reallocated to b: a's entry is stale.
  ASSERT_TRUE(pool->release(old).ok());
  const PageRef fresh = *pool->allocate();
  ASSERT_EQ(fresh.page, old.page);
  b.pages.push_back(fresh);
  // Page 3 freed but still listed by a.
  ASSERT_TRUE(pool->release(a.pages[3]).ok());
  // b: one entry out of range, one carrying generation 0 on a free page.
  b.pages.push_back(PageRef{1000, 5});
  b.pages.push_back(PageRef{9, kFreeGeneration});

  KvVerifier v(*pool);
  std::vector<VerifyFailure> out;
  const std::vector<VerifyItem> items{{7, a.pages}, {8, b.pages}};
  ASSERT_EQ(v.verify(items, out), 4u);
  EXPECT_EQ(out[0].sequence, 7u);
  EXPECT_EQ(out[0].index, 1u);
  EXPECT_EQ(out[0].page, old.page);
  EXPECT_EQ(out[0].expected_generation, old.generation);
  EXPECT_EQ(out[0].actual_generation, fresh.generation);
  EXPECT_EQ(out[0].fault, VerifyFault::kStaleGeneration);
  EXPECT_EQ(out[1].sequence, 7u);
  EXPECT_EQ(out[1].index, 3u);
  EXPECT_EQ(out[1].fault, VerifyFault::kPageFree);
  EXPECT_EQ(out[1].actual_generation, kFreeGeneration);
  EXPECT_EQ(out[2].sequence, 8u);
  EXPECT_EQ(out[2].fault, VerifyFault::kBadPage);
  EXPECT_EQ(out[2].page, 1000u);
  EXPECT_EQ(out[3].fault, VerifyFault::kPageFree);
  EXPECT_EQ(out[3].page, 9u);
  const std::string msg = describe(out[0]);
  EXPECT_NE(
      msg.find("sequence 7: page 1 (entry 1) generation mismatch: expected generation " +
               std::to_string(old.generation) + ", found " + std::to_string(fresh.generation)),
      std::string::npos)
      << msg;
  EXPECT_EQ(v.stats().violations, 4u);
  EXPECT_EQ(v.stats().checks, a.pages.size() + b.pages.size());
}

TEST(KvVerify, GenerationZeroOnAnAllocatedPageIsStale) {
  auto pool = make_pool(2);
  const PageRef r = *pool->allocate();
  const std::vector<PageRef> refs{PageRef{r.page, 0}};
  KvVerifier v(*pool);
  std::vector<VerifyFailure> out;
  const VerifyItem item{1, refs};
  ASSERT_EQ(v.verify({&item, 1}, out), 1u);
  EXPECT_EQ(out[0].fault, VerifyFault::kStaleGeneration);
}

TEST(KvVerify, SteadyStateDoesNotGrowTheOutputVector) {
  auto pool = make_pool(64);
  std::vector<PageTable> tables(8);
  std::vector<VerifyItem> items;
  for (size_t i = 0; i < tables.size(); ++i) {
    ASSERT_TRUE(page_table_grow(*pool, tables[i], 30));
    items.push_back({i, tables[i].pages});
  }
  KvVerifier v(*pool);
  std::vector<VerifyFailure> out;
  out.reserve(4);
  const auto* before = out.data();
  for (int step = 0; step < 1000; ++step) ASSERT_EQ(v.verify(items, out), 0u);
  EXPECT_EQ(out.data(), before);
  EXPECT_EQ(v.stats().checks, 1000u * 8u * 8u);
}

// Prints the cost of the check per page ref for a few batch shapes. Not an
// assertion: timing belongs to benchmarks, and this is one.
TEST(KvVerifyBench, NanosecondsPerPageRef) {
  struct Shape {
    int sequences, pages_each;
  };
  auto pool = make_pool(1 << 16);
  std::vector<PageRef> all;
  while (auto r = pool->allocate()) all.push_back(*r);
  std::mt19937 rng(3);
  std::shuffle(all.begin(), all.end(), rng);
  for (const Shape s : {Shape{1, 256}, Shape{8, 256}, Shape{64, 256}, Shape{256, 256}}) {
    std::vector<VerifyItem> items;
    for (int i = 0; i < s.sequences; ++i)
      items.push_back({uint64_t(i), std::span<const PageRef>(all).subspan(
                                        size_t(i) * size_t(s.pages_each), size_t(s.pages_each))});
    KvVerifier v(*pool);
    std::vector<VerifyFailure> out;
    const int64_t refs = int64_t(s.sequences) * s.pages_each;
    const int64_t passes = std::max<int64_t>(50, 8'000'000 / refs);
    size_t bad = v.verify(items, out);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t p = 0; p < passes; ++p) bad += v.verify(items, out);
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(bad, 0u);
    std::printf(
        "[kv verify] {\"sequences\": %d, \"pages_each\": %d, \"refs_per_pass\": %lld, "
        "\"ns_per_pass\": %.1f, \"ns_per_ref\": %.3f}\n",
        s.sequences, s.pages_each, (long long)refs, ns / double(passes),
        ns / double(passes * refs));
  }
}

}  // namespace
}  // namespace kvant
