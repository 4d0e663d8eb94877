// Scheduler tests with no model: a fake "model" samples a token that depends
// only on the sequence's context, so any preemption/recompute that loses or
// reorders a token changes the output. Covers budgets, chunked prefill, the
// running cap, decode-first ordering, preemption of the youngest, cancellation,
// prefix reuse and a random stress run with invariants checked every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "alloc_counter.h"
#include "engine/scheduler.h"

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

int32_t fake_next(std::span<const int32_t> context) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ uint64_t(uint32_t(t))) * 1099511628211ull;
  return int32_t(h % 1000);
}

SeqId add(Scheduler& s, std::vector<int32_t> prompt, int64_t max_tokens) {
  auto r = s.add({std::move(prompt), max_tokens});
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : 0;
}

// Checks the plan against the scheduler's state, then "runs" it.
std::vector<int32_t> fake_forward(const Scheduler& s, const StepPlan& plan, const PagePool& pool) {
  std::vector<int32_t> out;
  for (const ScheduledSequence& e : plan.sequences) {
    const SequenceState* st = s.find(e.id);
    EXPECT_NE(st, nullptr);
    if (st == nullptr) {
      out.push_back(-1);
      continue;
    }
    EXPECT_EQ(e.start, st->computed);
    EXPECT_EQ(int64_t(e.tokens.size()), e.n_tokens);
    EXPECT_TRUE(std::equal(e.tokens.begin(), e.tokens.end(), st->tokens.begin() + e.start));
    EXPECT_EQ(int64_t(e.pages.size()), kv_pages_for_tokens(e.start + e.n_tokens, kP));
    for (const PageRef& r : e.pages) EXPECT_TRUE(pool.is_current(r));
    EXPECT_EQ(e.samples, e.start + e.n_tokens == int64_t(st->tokens.size()));
    out.push_back(e.samples ? fake_next(st->tokens) : -1);
  }
  return out;
}

// One step; returns the plan's size.
size_t step(Scheduler& s, const PagePool& pool) {
  const StepPlan& plan = s.schedule();
  const size_t n = plan.sequences.size();
  auto sampled = fake_forward(s, plan, pool);
  auto r = s.commit(sampled);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  auto inv = s.check_invariants();
  EXPECT_TRUE(inv.ok()) << (inv.ok() ? "" : inv.error().message);
  return n;
}

// What the fake model generates for a prompt, run alone.
std::vector<int32_t> solo_output(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  std::vector<int32_t> t = prompt;
  for (int64_t i = 0; i < max_tokens; ++i) t.push_back(fake_next(t));
  return t;
}

TEST(Scheduler, RejectsBadRequests) {
  auto pool = make_pool(4);
  Scheduler s(*pool, nullptr, {});
  EXPECT_FALSE(s.add({{}, 4}).ok());
  EXPECT_FALSE(s.add({{1, 2}, 0}).ok());
  EXPECT_FALSE(s.add({seq(0, 15), 2}).ok());  // 17 tokens > 4 pages of 4
  EXPECT_TRUE(s.add({seq(0, 14), 2}).ok());
  EXPECT_FALSE(s.cancel(999).ok());
  EXPECT_FALSE(s.commit({}).ok());  // nothing scheduled
}

TEST(Scheduler, BudgetRespectedAndChunked) {
  auto pool = make_pool(64);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 16, .max_running = 8});
  const SeqId a = add(s, seq(0, 100), 3);
  int prefill_steps = 0;
  int64_t expected_start = 0;
  while (s.find(a) != nullptr && s.find(a)->generated == 0) {
    const StepPlan& plan = s.schedule();
    ASSERT_EQ(plan.sequences.size(), 1u);
    const ScheduledSequence& e = plan.sequences[0];
    EXPECT_LE(plan.total_tokens, 16);
    EXPECT_EQ(e.kind, StepKind::Prefill);
    EXPECT_EQ(e.start, expected_start);
    EXPECT_EQ(e.n_tokens, std::min<int64_t>(16, 100 - expected_start));
    expected_start += e.n_tokens;
    auto out = fake_forward(s, plan, *pool);
    ASSERT_TRUE(s.commit(out).ok());
    ++prefill_steps;
  }
  EXPECT_EQ(prefill_steps, 7);  // 6 x 16 + 4
  EXPECT_EQ(s.find(a)->tokens, solo_output(seq(0, 100), 1));
  while (s.find(a) != nullptr) step(s, *pool);
  EXPECT_EQ(pool->free_pages(), 64);
}

TEST(Scheduler, SeveralPromptsShareTheBudget) {
  auto pool = make_pool(64);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 8, .max_running = 8});
  for (int i = 0; i < 3; ++i) add(s, seq(100 * i, 10), 2);
  for (int i = 0; i < 20; ++i) {
    const StepPlan& plan = s.schedule();
    int64_t sum = 0;
    for (auto& e : plan.sequences) sum += e.n_tokens;
    EXPECT_EQ(sum, plan.total_tokens);
    EXPECT_LE(plan.total_tokens, 8);
    if (i == 0) {
      EXPECT_EQ(plan.total_tokens, 8);
    }
    auto out = fake_forward(s, plan, *pool);
    ASSERT_TRUE(s.commit(out).ok());
  }
  EXPECT_EQ(s.counters().running + s.counters().waiting, 0);
  EXPECT_EQ(s.counters().finished, 3);
  EXPECT_EQ(pool->free_pages(), 64);
}

TEST(Scheduler, MaxRunning) {
  auto pool = make_pool(64);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 256, .max_running = 2});
  for (int i = 0; i < 5; ++i) add(s, seq(10 * i, 5), 4);
  step(s, *pool);
  EXPECT_EQ(s.counters().running, 2);
  EXPECT_EQ(s.counters().waiting, 3);
  while (s.counters().running + s.counters().waiting > 0) {
    const size_t n = step(s, *pool);
    EXPECT_LE(n, 2u);
    EXPECT_LE(s.counters().running, 2);
  }
  EXPECT_EQ(pool->free_pages(), 64);
}

TEST(Scheduler, DecodesGoFirst) {
  auto pool = make_pool(64);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 4, .max_running = 8});
  const SeqId a = add(s, seq(0, 3), 20);
  const SeqId b = add(s, seq(50, 2), 20);
  step(s, *pool);  // a: prefill 3, b: prefill 1 (budget)
  step(s, *pool);  // a: decode, b: prefill 1 -> samples
  const SeqId c = add(s, seq(200, 40), 2);
  for (int i = 0; i < 10; ++i) {
    const StepPlan& plan = s.schedule();
    ASSERT_GE(plan.sequences.size(), 2u);
    EXPECT_EQ(plan.sequences[0].id, a);
    EXPECT_EQ(plan.sequences[0].kind, StepKind::Decode);
    EXPECT_EQ(plan.sequences[1].id, b);
    EXPECT_EQ(plan.sequences[1].kind, StepKind::Decode);
    ASSERT_EQ(plan.sequences.size(), 3u);
    EXPECT_EQ(plan.sequences[2].id, c);
    EXPECT_EQ(plan.sequences[2].n_tokens, 2);  // what the decodes left
    auto out = fake_forward(s, plan, *pool);
    ASSERT_TRUE(s.commit(out).ok());
  }
}

TEST(Scheduler, PreemptsYoungestAndRecomputeKeepsTokens) {
  // 6 pages of 4 tokens; three sequences of 4 prompt + 12 generated need 4
  // pages each, so they cannot all stay.
  auto pool = make_pool(6);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 64, .max_running = 8});
  std::vector<std::vector<int32_t>> prompts = {seq(0, 4), seq(10, 4), seq(20, 4)};
  std::vector<SeqId> ids;
  for (auto& p : prompts) ids.push_back(add(s, p, 12));
  std::map<SeqId, std::vector<int32_t>> outputs;
  bool saw_preempt = false;
  for (int i = 0; i < 200 && s.counters().running + s.counters().waiting > 0; ++i) {
    std::map<SeqId, std::vector<int32_t>> before;
    for (SeqId id : ids)
      if (s.find(id)) before[id] = s.find(id)->tokens;
    const StepPlan& plan = s.schedule();
    for (SeqId p : plan.preempted) {
      saw_preempt = true;
      // The youngest running sequence goes: no running sequence is younger.
      for (SeqId id : ids)
        if (s.find(id) && s.find(id)->status == SequenceStatus::Running) {
          EXPECT_LT(s.find(id)->arrival, s.find(p)->arrival);
        }
      EXPECT_EQ(s.find(p)->tokens, before[p]);  // generated tokens kept
      EXPECT_EQ(s.find(p)->computed, 0);
      EXPECT_TRUE(s.find(p)->table.pages.empty());
    }
    auto out = fake_forward(s, plan, *pool);
    for (size_t k = 0; k < plan.sequences.size(); ++k)
      if (plan.sequences[k].samples) {
        const SequenceState* st = s.find(plan.sequences[k].id);
        std::vector<int32_t> t = st->tokens;
        t.push_back(out[k]);
        outputs[st->id] = t;
      }
    ASSERT_TRUE(s.commit(out).ok());
    auto inv = s.check_invariants();
    ASSERT_TRUE(inv.ok()) << inv.error().message;
  }
  EXPECT_TRUE(saw_preempt);
  EXPECT_GT(s.counters().preemptions, 0);
  EXPECT_EQ(s.counters().finished, 3);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(outputs[ids[i]], solo_output(prompts[i], 12));
  EXPECT_EQ(pool->free_pages(), 6);
}

TEST(Scheduler, CancelReturnsEveryPage) {
  auto pool = make_pool(32);
  PrefixIndex index(*pool);
  Scheduler s(*pool, &index, {.max_step_tokens = 8, .max_running = 4});
  std::vector<SeqId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(add(s, seq(0, 9 + i), 10));
  for (int i = 0; i < 5; ++i) step(s, *pool);
  EXPECT_GT(s.counters().running, 0);
  EXPECT_GT(s.counters().waiting, 0);
  // Cancel one with a plan pending: commit skips it.
  const StepPlan& plan = s.schedule();
  const SeqId planned = plan.sequences.at(0).id;
  auto out = fake_forward(s, plan, *pool);
  ASSERT_TRUE(s.cancel(planned).ok());
  ASSERT_TRUE(s.commit(out).ok());
  ASSERT_TRUE(s.check_invariants().ok());
  for (SeqId id : ids)
    if (id != planned) {
      ASSERT_TRUE(s.cancel(id).ok());
    }
  EXPECT_FALSE(s.cancel(planned).ok());
  ASSERT_TRUE(s.check_invariants().ok());
  EXPECT_EQ(pool->free_pages() + index.size(), 32);
  index.clear();
  EXPECT_EQ(pool->free_pages(), 32);
}

TEST(Scheduler, FinishAnyReasonReleases) {
  auto pool = make_pool(16);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 64, .max_running = 4});
  const SeqId a = add(s, seq(0, 7), 5);
  const SeqId b = add(s, seq(9, 7), 5);
  const SeqId c = add(s, seq(99, 7), 5);
  step(s, *pool);
  EXPECT_LT(pool->free_pages(), 16);
  ASSERT_TRUE(s.finish(a, FinishReason::Stop).ok());
  ASSERT_TRUE(s.finish(b, FinishReason::Error).ok());
  ASSERT_TRUE(s.finish(c, FinishReason::Length).ok());
  EXPECT_EQ(pool->free_pages(), 16);
  ASSERT_TRUE(s.check_invariants().ok());
}

TEST(Scheduler, LengthFinishIsReported) {
  auto pool = make_pool(16);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 64, .max_running = 4});
  const SeqId a = add(s, seq(0, 5), 2);
  step(s, *pool);
  EXPECT_TRUE(s.finished().empty());
  step(s, *pool);
  ASSERT_EQ(s.finished().size(), 1u);
  EXPECT_EQ(s.finished()[0].id, a);
  EXPECT_EQ(s.finished()[0].reason, FinishReason::Length);
  EXPECT_EQ(s.find(a), nullptr);
  EXPECT_EQ(pool->free_pages(), 16);
}

TEST(Scheduler, PrefixReuseSkipsTokensAndSharesPages) {
  auto pool = make_pool(32);
  PrefixIndex index(*pool);
  Scheduler s(*pool, &index, {.max_step_tokens = 64, .max_running = 4});
  std::vector<int32_t> shared = seq(0, 8);  // two full pages
  std::vector<int32_t> pa = shared, pb = shared;
  pa.insert(pa.end(), {100, 101, 102});
  pb.insert(pb.end(), {200, 201});
  const SeqId a = add(s, pa, 6);
  step(s, *pool);  // a prefilled; its two full pages indexed
  EXPECT_EQ(index.size(), 2);
  const SeqId b = add(s, pb, 3);
  const StepPlan& plan = s.schedule();
  const ScheduledSequence* eb = nullptr;
  for (auto& e : plan.sequences)
    if (e.id == b) eb = &e;
  ASSERT_NE(eb, nullptr);
  EXPECT_EQ(eb->start, 8);  // the shared pages are not recomputed
  EXPECT_EQ(eb->n_tokens, 2);
  const SequenceState* sa = s.find(a);
  const SequenceState* sb = s.find(b);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(sb->table.pages[size_t(i)], sa->table.pages[size_t(i)]);
    EXPECT_EQ(pool->refcount(sa->table.pages[size_t(i)].page), 3u);  // a, b, the index
  }
  EXPECT_NE(sb->table.pages[2], sa->table.pages[2]);
  auto out = fake_forward(s, plan, *pool);
  ASSERT_TRUE(s.commit(out).ok());
  EXPECT_EQ(s.counters().prefix_hit_tokens, 8);
  EXPECT_EQ(s.find(b)->tokens, solo_output(pb, 1));
  // A prompt that is exactly two full pages keeps its last token to compute.
  const SeqId c = add(s, shared, 1);
  const StepPlan& p2 = s.schedule();
  for (auto& e : p2.sequences)
    if (e.id == c) {
      EXPECT_EQ(e.start, 4);
      EXPECT_EQ(e.n_tokens, 4);
    }
  ASSERT_TRUE(s.commit(fake_forward(s, p2, *pool)).ok());
  ASSERT_TRUE(s.cancel(a).ok());
  ASSERT_TRUE(s.cancel(b).ok());
  ASSERT_TRUE(s.check_invariants().ok());
  index.clear();
  EXPECT_EQ(pool->free_pages(), 32);
}

TEST(Scheduler, EvictsIndexPagesBeforePreempting) {
  auto pool = make_pool(8);
  PrefixIndex index(*pool);
  Scheduler s(*pool, &index, {.max_step_tokens = 64, .max_running = 4});
  const SeqId a = add(s, seq(0, 16), 1);  // 4 pages, indexed, then finished
  step(s, *pool);
  EXPECT_EQ(s.find(a), nullptr);
  EXPECT_EQ(index.size(), 4);
  EXPECT_EQ(pool->free_pages(), 4);
  const SeqId b = add(s, seq(500, 20), 4);  // 6 pages: needs index pages
  while (s.find(b) != nullptr) step(s, *pool);
  EXPECT_EQ(s.counters().preemptions, 0);
  EXPECT_GT(index.stats().evicted_pages, 0u);
  index.clear();
  EXPECT_EQ(pool->free_pages(), 8);
}

TEST(Scheduler, DecodeStepsAllocateNothing) {
  auto pool = make_pool(64);
  Scheduler s(*pool, nullptr, {.max_step_tokens = 64, .max_running = 8});
  for (int i = 0; i < 4; ++i) add(s, seq(10 * i, 5), 40);
  step(s, *pool);
  step(s, *pool);
  std::vector<int32_t> sampled(4, 7);
  int64_t allocs = 0, planned = 0;
  {
    testing::AllocCounter counter;
    for (int i = 0; i < 20; ++i) {
      const StepPlan& plan = s.schedule();
      planned += int64_t(plan.sequences.size());
      if (!s.commit(sampled).ok()) break;
    }
    allocs = counter.count();
  }
  EXPECT_EQ(planned, 80);
  EXPECT_EQ(allocs, 0);
  ASSERT_TRUE(s.check_invariants().ok());
}

TEST(Scheduler, RandomStress) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    auto pool = make_pool(16);
    PrefixIndex index(*pool);
    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    Scheduler s(*pool, seed == 3 ? nullptr : &index,
                {.max_step_tokens = uni(4, 24), .max_running = uni(4, 8)});
    std::vector<std::vector<int32_t>> bases = {seq(0, 12), seq(1000, 9), seq(2000, 16)};
    std::map<SeqId, std::pair<std::vector<int32_t>, int64_t>> live;  // prompt, max_tokens
    int64_t completed = 0;
    for (int it = 0; it < 4000; ++it) {
      if (uni(0, 2) == 0) {
        std::vector<int32_t> p;
        if (uni(0, 1)) {
          const auto& b = bases[size_t(uni(0, 2))];
          p.assign(b.begin(), b.begin() + uni(1, int(b.size())));
        }
        for (int k = uni(p.empty() ? 1 : 0, 14); k > 0; --k) p.push_back(uni(0, 5000));
        const int64_t mt = uni(1, 30);
        auto r = s.add({p, mt});
        if (r.ok()) live[r.value()] = {p, mt};
      }
      if (!live.empty() && uni(0, 19) == 0) {
        auto pick = live.begin();
        std::advance(pick, uni(0, int(live.size()) - 1));
        ASSERT_TRUE(
            s.finish(pick->first, uni(0, 1) ? FinishReason::Abort : FinishReason::Stop).ok());
        live.erase(pick);
      }
      const StepPlan& plan = s.schedule();
      ASSERT_LE(plan.total_tokens, s.options().max_step_tokens);
      ASSERT_LE(s.counters().running, s.options().max_running);
      ASSERT_TRUE(s.check_invariants().ok());
      auto out = fake_forward(s, plan, *pool);
      if (!plan.sequences.empty() && uni(0, 9) == 0) {
        // Cancel with the plan pending.
        const SeqId id = plan.sequences[size_t(uni(0, int(plan.sequences.size()) - 1))].id;
        ASSERT_TRUE(s.cancel(id).ok());
        live.erase(id);
      }
      ASSERT_TRUE(s.commit(out).ok());
      for (const FinishedSequence& f : s.finished()) {
        ASSERT_EQ(f.reason, FinishReason::Length);
        ++completed;
        live.erase(f.id);
      }
      // Every live sequence's tokens match what the model alone would give.
      for (auto& [id, pm] : live) {
        const SequenceState* st = s.find(id);
        ASSERT_NE(st, nullptr);
        const auto expect = solo_output(pm.first, st->generated);
        ASSERT_EQ(st->tokens, expect);
      }
      auto inv = s.check_invariants();
      ASSERT_TRUE(inv.ok()) << inv.error().message;
    }
    const SchedulerCounters c = s.counters();
    EXPECT_GT(completed, 50) << "seed " << seed;
    EXPECT_GT(c.preemptions, 0) << "seed " << seed;
    if (seed != 3) {
      EXPECT_GT(s.counters().prefix_hit_tokens, 0);
    }
    for (auto& [id, pm] : live) ASSERT_TRUE(s.cancel(id).ok());
    ASSERT_TRUE(s.check_invariants().ok());
    index.clear();
    EXPECT_EQ(pool->free_pages(), 16);
  }
}

}  // namespace
}  // namespace kvant
