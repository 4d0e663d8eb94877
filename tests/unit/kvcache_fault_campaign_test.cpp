// Fault injection against the integrity machinery. First one small test per
// fault kind, then a campaign: a toy workload of many sequences (no model)
// that prefill through the prefix index, decode a token per step, finish or
// get preempted, with a fault injected every 100 steps. Each step starts with
// the batched verification pass, as the engine's does. Checked:
//  - every fault is detected: by the pool on the spot, by verify() in the very
//    next pass (exactly the sequences whose expected (page, generation) went
//    stale, before their next step), or by the invariant checker;
//  - no false positive in over 100,000 clean steps;
//  - no corrupted completion: every sequence that finishes reads back, from
//    its pages, the content signature of each of its own tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kvcache/fault_injector.h"
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

size_t verify_one(PagePool& pool, const PageTable& t) {
  KvVerifier v(pool);
  std::vector<VerifyFailure> out;
  const VerifyItem item{1, t.pages};
  return v.verify({&item, 1}, out);
}

TEST(KvFault, ReassignMakesVictimStaleAndThiefValid) {
  auto pool = make_pool(8);
  PageTable victim, thief;
  ASSERT_TRUE(page_table_grow(*pool, victim, 8));
  ASSERT_TRUE(page_table_grow(*pool, thief, 1));
  FaultInjector inject(*pool);
  const PageRef old = victim.pages[1];
  const PageRef now = inject.reassign_page(victim, 1, thief);
  EXPECT_EQ(now.page, old.page);
  EXPECT_NE(now.generation, old.generation);
  EXPECT_EQ(verify_one(*pool, victim), 1u);
  EXPECT_EQ(verify_one(*pool, thief), 0u);
  EXPECT_FALSE(page_table_release(*pool, victim).rejected == 0);
  EXPECT_EQ(pool->refcount(now.page), 1u);  // the thief's page survived the victim's abort
}

TEST(KvFault, CorruptedEntriesFailVerify) {
  auto pool = make_pool(8);
  PageTable t, other;
  ASSERT_TRUE(page_table_grow(*pool, t, 8));
  ASSERT_TRUE(page_table_grow(*pool, other, 4));
  FaultInjector inject(*pool);
  inject.redirect_entry(t, 0, other.pages[0].page);  // an allocated page, another generation
  EXPECT_EQ(verify_one(*pool, t), 1u);
  t.pages[0].page = uint32_t(pool->num_pages() - 1);  // a free page
  EXPECT_EQ(verify_one(*pool, t), 1u);
  PageTable u;
  ASSERT_TRUE(page_table_grow(*pool, u, 4));
  for (int bit = 0; bit < 32; ++bit) {
    inject.flip_generation(u, 0, 1u << bit);
    EXPECT_EQ(verify_one(*pool, u), 1u) << bit;
    inject.flip_generation(u, 0, 1u << bit);
    EXPECT_EQ(verify_one(*pool, u), 0u);
  }
  EXPECT_EQ(inject.counts().flipped, 64u);
}

TEST(KvFault, DoubleFreeAndEarlyFree) {
  auto pool = make_pool(8);
  FaultInjector inject(*pool);
  // Sole holder: the second release is refused on the spot.
  PageTable a;
  ASSERT_TRUE(page_table_grow(*pool, a, 8));
  EXPECT_FALSE(inject.double_free(a, 1).ok());
  EXPECT_EQ(pool->free_pages(), 8);
  // Shared page: the second release takes the other holder's reference;
  // the page is freed under it, and its next verify fails.
  PageTable b, c;
  ASSERT_TRUE(page_table_grow(*pool, b, 4));
  c.pages = b.pages;
  c.tokens = 4;
  ASSERT_TRUE(pool->retain(c.pages[0]).ok());
  EXPECT_TRUE(inject.double_free(b, 0).ok());
  EXPECT_EQ(verify_one(*pool, c), 1u);
  // Early free with another holder left: the refcount no longer matches the
  // holders, which only the invariant checker can see.
  PageTable d, e;
  ASSERT_TRUE(page_table_grow(*pool, d, 4));
  e.pages = d.pages;
  ASSERT_TRUE(pool->retain(e.pages[0]).ok());
  ASSERT_TRUE(inject.free_while_referenced(d, 0).ok());
  EXPECT_EQ(verify_one(*pool, d), 0u);
  std::vector<PageRef> holders = d.pages;
  holders.insert(holders.end(), e.pages.begin(), e.pages.end());
  std::vector<uint32_t> bad;
  EXPECT_FALSE(pool->check_invariants(holders, &bad).ok());
  EXPECT_EQ(bad, std::vector<uint32_t>{d.pages[0].page});
  EXPECT_EQ(inject.counts().total(), 3u);
}

// ---------------------------------------------------------------------------
// The campaign.

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Seq {
  uint64_t id = 0;
  PageTable table;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  std::vector<uint64_t> sigs;   // sigs[i]: content signature of token i given its prefix
  int64_t prompt_len = 0;
  int64_t target_len = 0;
};

enum FaultKind { kReassign, kRedirect, kFlip, kDoubleFree, kEarlyFree, kKinds };
const char* const kKindNames[kKinds] = {"reassign", "redirect", "flip_generation", "double_free",
                                        "free_while_referenced"};

struct Tally {
  uint64_t injected[kKinds] = {}, by_pool[kKinds] = {}, by_verify[kKinds] = {},
           by_checker[kKinds] = {}, undetected[kKinds] = {};
  uint64_t clean_steps = 0, false_positives = 0, verify_mismatch = 0, refs_checked = 0;
  uint64_t finished = 0, corrupted = 0, preempted = 0, aborted = 0, sweeps = 0;
};

class Campaign {
 public:
  static constexpr int64_t kPages = 640;
  static constexpr size_t kConcurrency = 48;

  explicit Campaign(uint64_t seed)
      : pool_(make_pool(kPages)), index_(*pool_), verifier_(*pool_), inject_(*pool_), rng_(seed) {
    std::uniform_int_distribution<int> len(5, 40), tok(0, 999);
    for (auto& p : system_prompts_) {
      p.resize(size_t(len(rng_)));
      for (auto& t : p) t = tok(rng_);
    }
    items_.reserve(kConcurrency * 2);
    failures_.reserve(64);
  }

  void run(int64_t steps, int64_t fault_every) {
    for (int64_t step = 0; step < steps; ++step) {
      Expect e;
      const bool fault = step % fault_every == fault_every / 2 && inject(e);
      // The per-step integrity pass over every page each sequence will touch.
      items_.clear();
      for (const Seq& s : live_) items_.push_back({s.id, s.table.pages});
      failures_.clear();
      verifier_.verify(items_, failures_);
      flagged_.clear();
      for (const VerifyFailure& f : failures_) flagged_.push_back(f.sequence);
      std::sort(flagged_.begin(), flagged_.end());
      flagged_.erase(std::unique(flagged_.begin(), flagged_.end()), flagged_.end());
      if (!fault) {
        ++t_.clean_steps;
        if (!failures_.empty()) {
          ++t_.false_positives;
          ADD_FAILURE() << "false positive at step " << step << ": " << describe(failures_[0]);
        }
      } else {
        settle(e, step);
      }
      if (step % 500 == 0) sweep(step);
      advance();
    }
    sweep(steps);
  }

  void release_all() {
    for (Seq& s : live_) page_table_release(*pool_, s.table);
    live_.clear();
    index_.clear();
  }

  const Tally& tally() const { return t_; }
  const PagePool& pool() const { return *pool_; }
  const PrefixIndex& index() const { return index_; }
  const KvVerifier& verifier() const { return verifier_; }
  const FaultInjector& injector() const { return inject_; }

 private:
  struct Expect {
    FaultKind kind = kReassign;
    std::vector<uint64_t> stale;    // sequences verify() must flag, sorted
    bool pool_refused = false;      // the pool returned an error at injection
    bool checker_required = false;  // only the invariant checker can see it
  };

  std::vector<uint64_t> holders_of(PageRef r) const {
    std::vector<uint64_t> ids;
    for (const Seq& s : live_)
      if (std::find(s.table.pages.begin(), s.table.pages.end(), r) != s.table.pages.end())
        ids.push_back(s.id);
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  std::vector<PageRef> all_holders() const {
    std::vector<PageRef> h;
    for (const Seq& s : live_) h.insert(h.end(), s.table.pages.begin(), s.table.pages.end());
    index_.collect_refs(h);
    return h;
  }

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  bool inject(Expect& e) {
    std::vector<size_t> candidates;
    for (size_t i = 0; i < live_.size(); ++i)
      if (!live_[i].table.pages.empty()) candidates.push_back(i);
    if (candidates.empty()) return false;
    const size_t vi = candidates[pick(candidates.size())];
    Seq& victim = live_[vi];
    // Half the time the first page, which is often a shared prefix page.
    const size_t idx = pick(2) == 0 ? 0 : pick(victim.table.pages.size());
    const PageRef old = victim.table.pages[idx];
    e.kind = FaultKind(pick(kKinds));
    ++t_.injected[e.kind];
    switch (e.kind) {
      case kReassign: {
        e.stale = holders_of(old);
        const size_t ti = live_.size() > 1 ? (vi + 1 + pick(live_.size() - 1)) % live_.size() : vi;
        inject_.reassign_page(victim.table, idx, live_[ti].table);
        break;
      }
      case kRedirect: {
        uint32_t other = uint32_t(pick(size_t(kPages) - 1));
        if (other >= old.page) ++other;
        inject_.redirect_entry(victim.table, idx, other);
        e.stale = {victim.id};
        break;
      }
      case kFlip:
        inject_.flip_generation(victim.table, idx, 1u << pick(32));
        e.stale = {victim.id};
        break;
      case kDoubleFree: {
        // The victim finishes (its pages released), then one is released again.
        auto r = inject_.double_free(victim.table, idx);
        live_.erase(live_.begin() + std::ptrdiff_t(vi));
        e.pool_refused = !r.ok();
        if (!e.pool_refused && !pool_->is_current(old)) e.stale = holders_of(old);
        e.checker_required = !e.pool_refused && pool_->is_current(old);
        break;
      }
      case kEarlyFree: {
        auto r = inject_.free_while_referenced(victim.table, idx);
        EXPECT_TRUE(r.ok()) << r.error().message;
        if (!pool_->is_current(old)) e.stale = holders_of(old);
        e.checker_required = pool_->is_current(old);
        break;
      }
      default:
        break;
    }
    return true;
  }

  // After the verification pass of a fault step: check what was detected,
  // then recover as the engine would (abort flagged sequences) plus the debug
  // repair, and require a consistent pool again.
  void settle(const Expect& e, int64_t step) {
    if (flagged_ != e.stale) {
      ++t_.verify_mismatch;
      ADD_FAILURE() << "step " << step << " fault " << kKindNames[e.kind] << ": verify flagged "
                    << flagged_.size() << " sequences, expected " << e.stale.size();
    }
    std::vector<uint32_t> bad;
    const bool checker = !pool_->check_invariants(all_holders(), &bad).ok();
    if (e.checker_required && !checker)
      ADD_FAILURE() << "step " << step << ": invariant checker missed " << kKindNames[e.kind];
    const bool by_verify = !flagged_.empty();
    if (e.pool_refused) ++t_.by_pool[e.kind];
    if (by_verify) ++t_.by_verify[e.kind];
    if (checker) ++t_.by_checker[e.kind];
    if (!e.pool_refused && !by_verify && !checker) {
      ++t_.undetected[e.kind];
      ADD_FAILURE() << "step " << step << ": undetected " << kKindNames[e.kind];
    }
    for (uint64_t id : flagged_) {
      auto it = std::find_if(live_.begin(), live_.end(), [&](const Seq& s) { return s.id == id; });
      page_table_release(*pool_, it->table);
      live_.erase(it);
      ++t_.aborted;
    }
    index_.drop_stale();
    const std::vector<PageRef> holders = all_holders();
    pool_->repair(holders);
    auto ok = pool_->check_invariants(holders);
    ASSERT_TRUE(ok.ok()) << "step " << step << " after recovery: " << ok.error().message;
  }

  void sweep(int64_t step) {
    ++t_.sweeps;
    auto ok = pool_->check_invariants(all_holders());
    EXPECT_TRUE(ok.ok()) << "step " << step << ": " << ok.error().message;
  }

  // Writes token `pos`'s signature into its slot, as a kernel writes K.
  void write_sig(const Seq& s, int64_t pos) {
    const KvSlot at = page_table_locate(s.table, pos, kP);
    auto* k = static_cast<uint64_t*>(pool_->k_data(at.ref.page, 0));
    k[at.slot * 2] = s.sigs[size_t(pos)];  // head_dim 8 BF16 = two uint64 per slot
  }

  void push_token(Seq& s, int32_t tok) {
    const uint64_t prev = s.sigs.empty() ? 0x5eedull : s.sigs.back();
    s.tokens.push_back(tok);
    s.sigs.push_back(mix(prev ^ (uint64_t(uint32_t(tok)) * 0x100000001b3ull)));
  }

  // Grows the table; under pressure evicts prefix pages; false when the pool
  // is still short (the caller preempts).
  bool grow(Seq& s, int64_t n) {
    const int64_t need = page_table_pages_needed(s.table, n, kP);
    if (need > pool_->free_pages()) index_.evict_for(need - pool_->free_pages());
    return page_table_grow(*pool_, s.table, n);
  }

  void finish(size_t i, bool completed) {
    Seq& s = live_[i];
    if (completed) {
      // The completion: read every token's content back from the pages.
      ++t_.finished;
      for (int64_t pos = 0; pos < s.table.tokens; ++pos) {
        const KvSlot at = page_table_locate(s.table, pos, kP);
        const auto* k = static_cast<const uint64_t*>(pool_->k_data(at.ref.page, 0));
        if (k[at.slot * 2] != s.sigs[size_t(pos)]) {
          ++t_.corrupted;
          ADD_FAILURE() << "sequence " << s.id << " read foreign content at position " << pos;
          break;
        }
      }
    } else {
      ++t_.preempted;
    }
    page_table_release(*pool_, s.table);
    live_[i] = std::move(live_.back());
    live_.pop_back();
  }

  void spawn() {
    Seq s;
    s.id = next_id_++;
    std::uniform_int_distribution<int> tok(0, 999), tail(1, 10), gen(1, 100);
    if (pick(4) != 0) {
      for (int32_t t : system_prompts_[pick(system_prompts_.size())]) push_token(s, t);
    }
    for (int i = tail(rng_); i > 0; --i) push_token(s, tok(rng_));
    s.prompt_len = int64_t(s.tokens.size());
    s.target_len = s.prompt_len + gen(rng_);
    // Prefill: reuse indexed pages (keeping the last prompt token to compute),
    // allocate the rest, write the new tokens, index the prompt's full pages.
    const std::span<const int32_t> prompt(s.tokens);
    const int64_t hit = index_.lookup(prompt.first(prompt.size() - 1), s.table.pages);
    s.table.tokens = hit * kP;
    if (!grow(s, s.prompt_len - s.table.tokens)) {
      page_table_release(*pool_, s.table);
      ++t_.preempted;
      return;
    }
    for (int64_t pos = hit * kP; pos < s.prompt_len; ++pos) write_sig(s, pos);
    index_.insert(prompt, s.table.pages);
    live_.push_back(std::move(s));
  }

  void advance() {
    std::uniform_int_distribution<int> tok(0, 999);
    for (size_t i = 0; i < live_.size();) {
      Seq& s = live_[i];
      if (s.table.tokens >= s.target_len) {
        finish(i, true);
        continue;
      }
      push_token(s, tok(rng_));
      if (!grow(s, 1)) {
        finish(i, false);
        continue;
      }
      write_sig(s, s.table.tokens - 1);
      ++i;
    }
    for (int n = 0; n < 2 && live_.size() < kConcurrency; ++n) spawn();
  }

  std::unique_ptr<PagePool> pool_;
  PrefixIndex index_;
  KvVerifier verifier_;
  FaultInjector inject_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> system_prompts_ = std::vector<std::vector<int32_t>>(8);
  std::vector<Seq> live_;
  std::vector<VerifyItem> items_;
  std::vector<VerifyFailure> failures_;
  std::vector<uint64_t> flagged_;
  uint64_t next_id_ = 1;
  Tally t_;
};

TEST(KvFaultCampaign, EveryFaultDetectedNoFalsePositives) {
  Campaign c(20240611);
  c.run(/*steps=*/110'000, /*fault_every=*/100);
  const Tally& t = c.tally();
  uint64_t injected = 0, undetected = 0;
  for (int k = 0; k < kKinds; ++k) {
    std::printf(
        "[kv faults] %-22s injected %4llu  caught by pool %4llu  verify %4llu  "
        "checker %4llu  undetected %llu\n",
        kKindNames[k], (unsigned long long)t.injected[k], (unsigned long long)t.by_pool[k],
        (unsigned long long)t.by_verify[k], (unsigned long long)t.by_checker[k],
        (unsigned long long)t.undetected[k]);
    injected += t.injected[k];
    undetected += t.undetected[k];
  }
  const PrefixStats& ps = c.index().stats();
  std::printf(
      "[kv faults] total injected %llu, undetected %llu, verify mismatches %llu; "
      "clean steps %llu, false positives %llu; page refs verified %llu in %llu passes\n",
      (unsigned long long)injected, (unsigned long long)undetected,
      (unsigned long long)t.verify_mismatch, (unsigned long long)t.clean_steps,
      (unsigned long long)t.false_positives, (unsigned long long)c.verifier().stats().checks,
      (unsigned long long)c.verifier().stats().passes);
  std::printf(
      "[kv faults] completions %llu (corrupted %llu), aborted %llu, preempted %llu, "
      "invariant sweeps %llu; prefix hit pages %llu / miss %llu, evicted %llu\n",
      (unsigned long long)t.finished, (unsigned long long)t.corrupted,
      (unsigned long long)t.aborted, (unsigned long long)t.preempted, (unsigned long long)t.sweeps,
      (unsigned long long)ps.hit_pages, (unsigned long long)ps.miss_pages,
      (unsigned long long)ps.evicted_pages);
  EXPECT_GE(injected, 1000u);
  EXPECT_EQ(injected, c.injector().counts().total());
  EXPECT_EQ(undetected, 0u);
  EXPECT_EQ(t.verify_mismatch, 0u);
  EXPECT_GE(t.clean_steps, 100'000u);
  EXPECT_EQ(t.false_positives, 0u);
  EXPECT_EQ(t.corrupted, 0u);
  EXPECT_GT(t.finished, 10'000u);
  EXPECT_GT(ps.hit_pages, 0u);
  EXPECT_GT(ps.evicted_pages, 0u);
  for (int k = 0; k < kKinds; ++k) EXPECT_GT(t.injected[k], 100u) << kKindNames[k];
  c.release_all();
  EXPECT_EQ(c.pool().free_pages(), Campaign::kPages);
}

}  // namespace
}  // namespace kvant
