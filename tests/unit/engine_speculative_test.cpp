// Speculative decoding by prompt lookup: the n-gram proposer; the
// scheduler's drafted decodes (draft tokens fed after the last token, the
// rejected ones dropped with their pages) under a random stress with a fake
// model; and the engine end to end on tiny fixture models, where a request's
// tokens must be bitwise those it gets without speculation -- greedy and
// seeded sampling, BF16 and FP8 pages, INT4 decode weights, latent attention,
// stop strings, under continuous batching with preemption.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine/speculative_pacer.h"
#include "kvcache/page_pool.h"
#include "kvcache/prefix_index.h"

namespace kvant {
namespace {

// --- the proposer ----------------------------------------------------------

std::vector<int32_t> propose(std::vector<int32_t> t, int k, int lo, int hi) {
  std::vector<int32_t> d;
  ngram_propose(t, SpeculativeParams{k, lo, hi}, d);
  return d;
}

TEST(Speculative, NgramTakesTheLatestLongestMatch) {
  // Suffix "7 8": earlier at 1 (followed by 9 1) and at 5 (followed by 4 4).
  EXPECT_EQ(propose({6, 7, 8, 9, 1, 7, 8, 4, 4, 5, 7, 8}, 2, 2, 4), (std::vector<int32_t>{4, 4}));
  // Longest first: "3 7 8" matches at 0 only, before the later "7 8".
  EXPECT_EQ(propose({3, 7, 8, 1, 2, 7, 8, 5, 3, 7, 8}, 3, 2, 4), (std::vector<int32_t>{1, 2, 7}));
  // The draft stops at the end of the text.
  EXPECT_EQ(propose({1, 2, 3, 1, 2}, 8, 2, 4), (std::vector<int32_t>{3, 1, 2}));
  // No earlier occurrence, or a suffix shorter than min_ngram: nothing.
  EXPECT_TRUE(propose({1, 2, 3, 4, 5}, 4, 1, 4).empty());
  EXPECT_TRUE(propose({5, 1, 2, 5}, 4, 2, 4).empty());
  EXPECT_EQ(propose({5, 1, 2, 5}, 4, 1, 4), (std::vector<int32_t>{1, 2, 5}));
  EXPECT_TRUE(propose({5}, 4, 1, 4).empty());
  EXPECT_TRUE(propose({}, 4, 1, 4).empty());
  EXPECT_TRUE(propose({1, 1, 1, 1}, 0, 1, 4).empty());  // off
  // A run of one token proposes more of it.
  EXPECT_EQ(propose({9, 1, 1, 1, 1}, 3, 2, 4), (std::vector<int32_t>{1}));
}

TEST(Speculative, ParamsAreChecked) {
  EXPECT_TRUE(check_speculative_params({}).ok());
  EXPECT_TRUE(check_speculative_params({4, 1, 3}).ok());
  EXPECT_FALSE(check_speculative_params({-1, 2, 4}).ok());
  EXPECT_FALSE(check_speculative_params({17, 2, 4}).ok());
  EXPECT_FALSE(check_speculative_params({4, 0, 4}).ok());
  EXPECT_FALSE(check_speculative_params({4, 3, 2}).ok());
  EXPECT_FALSE(check_speculative_params({4, 2, 17}).ok());
}

TEST(Speculative, PacerBacksOffAfterWhollyRejectedDrafts) {
  SpeculativePacer p;
  EXPECT_TRUE(p.may_draft(1));
  p.record(4, 0);  // miss 1: pause 1
  EXPECT_FALSE(p.may_draft(1));
  EXPECT_TRUE(p.may_draft(1));
  p.record(4, 0);  // miss 2: pause 2
  EXPECT_FALSE(p.may_draft(1));
  EXPECT_FALSE(p.may_draft(1));
  EXPECT_TRUE(p.may_draft(1));
  for (int i = 0; i < 5; ++i) p.record(4, 0);
  EXPECT_EQ(p.pause, 8);
  p.record(4, 1);  // an accepted token: no more misses (the pause runs out)
  EXPECT_EQ(p.misses, 0);
  p.record(0, 0);  // no draft: nothing changes
  EXPECT_EQ(p.misses, 0);
}

TEST(Speculative, PacerAsksMoreOfARequestInABiggerBatch) {
  EXPECT_EQ(SpeculativePacer::bar(1), 0.f);
  EXPECT_EQ(SpeculativePacer::bar(2), 0.f);
  EXPECT_FLOAT_EQ(SpeculativePacer::bar(8), 0.6f);
  EXPECT_FLOAT_EQ(SpeculativePacer::bar(64), 0.75f);
  // Half the drafts accepted: drafts alone, not among 8.
  SpeculativePacer half;
  for (int i = 0; i < 30; ++i) half.record(4, 2);
  EXPECT_NEAR(half.rate, 0.5f, 1e-3);
  EXPECT_TRUE(half.may_draft(1));
  EXPECT_FALSE(half.may_draft(8));
  // Four in five accepted: drafts among 8 and among 64.
  SpeculativePacer most;
  for (int i = 0; i < 30; ++i) most.record(5, 4);
  EXPECT_TRUE(most.may_draft(8));
  EXPECT_TRUE(most.may_draft(64));
}

// --- the scheduler, with a fake model ---------------------------------------

constexpr int64_t kP = 4;  // page_tokens

int32_t fake_next(std::span<const int32_t> context) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ uint64_t(uint32_t(t))) * 1099511628211ull;
  return int32_t(h % 7);  // a small alphabet: drafts are often right
}

std::vector<int32_t> solo_output(const std::vector<int32_t>& prompt, int64_t n) {
  std::vector<int32_t> t = prompt;
  for (int64_t i = 0; i < n; ++i) t.push_back(fake_next(t));
  return t;
}

TEST(Speculative, SchedulerKeepsAcceptedDraftsAndDropsTheRest) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    auto pool = PagePool::create(
        {.geometry = {.layers = 1, .kv_heads = 1, .head_dim = 8, .dtype = KvDType::kBf16,
                      .page_tokens = kP},
         .num_pages = 12});
    ASSERT_TRUE(pool.ok());
    PrefixIndex index(**pool);
    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    Scheduler s(**pool, seed % 2 ? &index : nullptr,
                {.max_step_tokens = uni(3, 24), .max_running = uni(2, 6)});
    std::map<SeqId, std::pair<std::vector<int32_t>, int64_t>> live;
    int64_t completed = 0, drafted = 0, accepted = 0, rejected = 0;
    for (int it = 0; it < 3000; ++it) {
      if (uni(0, 2) == 0) {
        std::vector<int32_t> p;
        for (int k = uni(1, 12); k > 0; --k) p.push_back(uni(0, 6));
        const int64_t mt = uni(1, 30);
        auto r = s.add({p, mt});
        if (r.ok()) live[r.value()] = {p, mt};
      }
      // Drafts for every live sequence: its true continuation with a random
      // wrong token somewhere, or random tokens (ignored where not decoding).
      for (auto& [id, pm] : live) {
        const SequenceState* st = s.find(id);
        const auto truth = solo_output(pm.first, st->generated + 8);
        std::vector<int32_t> d(truth.begin() + int64_t(st->tokens.size()),
                               truth.begin() + int64_t(st->tokens.size()) + uni(0, 6));
        if (!d.empty() && uni(0, 1)) d[size_t(uni(0, int(d.size()) - 1))] = uni(0, 6);
        s.propose(id, d);
      }
      const StepPlan& plan = s.schedule();
      ASSERT_LE(plan.total_tokens, s.options().max_step_tokens);
      ASSERT_TRUE(s.check_invariants().ok());
      std::vector<int32_t> out, acc;
      for (const ScheduledSequence& e : plan.sequences) {
        const SequenceState* st = s.find(e.id);
        ASSERT_EQ(int64_t(e.tokens.size()), e.n_tokens);
        ASSERT_EQ(int64_t(e.pages.size()), kv_pages_for_tokens(e.start + e.n_tokens, kP));
        int32_t a = 0, tok = -1;
        if (e.draft > 0) {
          ASSERT_EQ(e.kind, StepKind::Decode);
          ASSERT_EQ(e.n_tokens, 1 + e.draft);
          ASSERT_LE(st->generated + 1 + e.draft, st->max_tokens);
          // Verify as the engine does: the token after each row.
          for (int64_t t = 0; t <= e.draft; ++t) {
            tok = fake_next(std::span<const int32_t>(st->tokens).first(size_t(e.start + t + 1)));
            if (t == e.draft || tok != e.tokens[size_t(t + 1)]) break;
            ++a;
          }
          drafted += e.draft;
          accepted += a;
          rejected += e.draft - a;
        } else if (e.samples) {
          tok = fake_next(st->tokens);
        }
        out.push_back(tok);
        acc.push_back(a);
      }
      ASSERT_TRUE(s.commit(out, acc).ok());
      for (const FinishedSequence& f : s.finished()) {
        ++completed;
        live.erase(f.id);
      }
      for (auto& [id, pm] : live) {
        const SequenceState* st = s.find(id);
        ASSERT_EQ(st->tokens, solo_output(pm.first, st->generated)) << "seed " << seed;
        ASSERT_LE(st->generated, pm.second);
      }
      auto inv = s.check_invariants();
      ASSERT_TRUE(inv.ok()) << inv.error().message;
    }
    EXPECT_GT(completed, 50);
    EXPECT_GT(accepted, 100) << "seed " << seed;
    EXPECT_GT(rejected, 100) << "seed " << seed;
    EXPECT_GT(s.counters().preemptions, 0) << "seed " << seed;
    for (auto& [id, pm] : live) ASSERT_TRUE(s.cancel(id).ok());
    index.clear();
    EXPECT_EQ((*pool)->free_pages(), 12);
  }
}


// --- the engine on fixture models -------------------------------------------

std::string tiny(const std::string& name) {
  return std::string(KVANT_FIXTURES) + "/golden/" + name;
}

EngineOptions tiny_options(const std::string& arch) {
  EngineOptions o;
  o.model_path = tiny(arch);
  o.tokenizer_path = std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  o.kv_memory_bytes = int64_t(64) << 20;
  o.log_capacity = false;
  o.debug_invariants = true;
  return o;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  FinishReason finish = FinishReason::None;
  int finals = 0;
};

// Prompts a lookup finds drafts in: random tokens with a span repeated, so
// that a model that copies (or loops) gets its continuation proposed.
std::vector<std::vector<int32_t>> copying_prompts(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> ps;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> span, p;
    for (int j = uni(6, 20); j > 0; --j) span.push_back(uni(0, 319));
    for (int j = uni(0, 10); j > 0; --j) p.push_back(uni(0, 319));
    p.insert(p.end(), span.begin(), span.end());
    for (int j = uni(0, 6); j > 0; --j) p.push_back(uni(0, 319));
    p.insert(p.end(), span.begin(), span.begin() + uni(2, 5));
    ps.push_back(p);
  }
  return ps;
}

struct RunSpec {
  SpeculativeParams spec;
  SamplingParams sampling;
  std::vector<std::string> stop;
  int gen = 24;
  bool staggered = false;  // arrivals spread over the first steps
  bool logprobs = false;
};

std::vector<Outcome> run(const EngineOptions& o, const std::vector<std::vector<int32_t>>& ps,
                         const RunSpec& rs, EngineStats* stats = nullptr) {
  std::vector<Outcome> out(ps.size());
  auto e = Engine::create(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return out;
  size_t next = 0;
  std::mt19937 rng(3);
  while (next < ps.size() || !(*e)->idle()) {
    const size_t arrivals = rs.staggered ? size_t(rng() % 3) : ps.size();
    for (size_t a = 0; a < arrivals && next < ps.size(); ++a, ++next) {
      Request r;
      r.prompt = ps[next];
      r.stop.max_tokens = rs.gen;
      r.stop.ignore_eos = true;
      r.stop.stop = rs.stop;
      r.sampling = rs.sampling;
      r.sampling.seed = 1000 + next;
      r.speculative = rs.spec;
      r.logprobs = rs.logprobs;
      Outcome* oc = &out[next];
      r.on_event = [oc](const RequestEvent& ev) {
        if (ev.token >= 0) oc->tokens.push_back(ev.token);
        if (ev.token >= 0 && ev.logprobs) oc->logprobs.push_back(ev.logprobs->chosen.logprob);
        oc->text += ev.text;
        if (ev.finish != FinishReason::None) {
          oc->finish = ev.finish;
          ++oc->finals;
        }
      };
      EXPECT_TRUE((*e)->submit(std::move(r)).ok());
    }
    auto st = (*e)->step();
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    if (!st.ok()) break;
  }
  EXPECT_TRUE((*e)->check_invariants().ok());
  if (stats) *stats = (*e)->stats();
  return out;
}

void expect_same(const std::vector<Outcome>& a, const std::vector<Outcome>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << " request " << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << what << " request " << i;
    EXPECT_EQ(a[i].text, b[i].text) << what << " request " << i;
    EXPECT_EQ(a[i].finish, b[i].finish) << what << " request " << i;
    EXPECT_EQ(a[i].finals, 1) << what << " request " << i;
  }
}

const SpeculativeParams kSpec{4, 1, 3};

TEST(Speculative, EngineOutputIsBitwiseTheSameWithDrafts) {
  // Greedy and seeded sampling, BF16 pages and FP8 pages (each token of a
  // drafted step is a decode of its position, so FP8 pages are read back
  // exactly as without drafts), with logprobs.
  int64_t accepted = 0;
  for (const char* arch : {"llama3", "gemma3", "qwen3_moe", "deepseek_v3", "glm_moe_dsa_sparse"}) {
    const auto ps = copying_prompts(6, 7);
    for (bool fp8 : {false, true}) {
      for (bool sample : {false, true}) {
        EngineOptions o = tiny_options(arch);
        o.max_step_tokens = 4096;  // every prompt in the first step: the same chunks both ways
        if (fp8) o.kv_dtype = KvDType::kFp8E4m3;
        RunSpec rs;
        rs.logprobs = true;
        if (sample) {
          rs.sampling.temperature = 0.9f;
          rs.sampling.top_p = 0.95f;
        }
        const auto base = run(o, ps, rs);
        rs.spec = kSpec;
        EngineStats st;
        const auto spec = run(o, ps, rs, &st);
        const std::string what = std::string(arch) + (fp8 ? " fp8" : " bf16") +
                                 (sample ? " sampled" : " greedy");
        expect_same(base, spec, what);
        EXPECT_GT(st.spec_draft_tokens, 0) << what;
        accepted += st.spec_accepted_tokens;
        EXPECT_LE(st.spec_accepted_tokens, st.spec_draft_tokens);
      }
    }
  }
  EXPECT_GT(accepted, 100) << "the fixtures should take some drafts";
}

TEST(Speculative, UnderContinuousBatchingPreemptionAndPrefixCaching) {
  // BF16 pages: batch invariance makes every request's tokens those of its
  // solo run, with drafts competing for the step budget and the pages, small
  // pools forcing preemption, and 4-token pages whose drafted tail pages are
  // given back on rejection.
  // (Latent attention is left out: its prefill expands the latent where its
  // decode absorbs the projections, so its tokens depend on the chunking
  // with or without drafts.)
  for (const char* arch : {"llama3", "gemma3"}) {
    const auto ps = copying_prompts(10, 11);
    RunSpec rs;
    rs.gen = 30;
    EngineOptions solo = tiny_options(arch);
    solo.max_step_tokens = 4096;
    std::vector<Outcome> alone;
    for (const auto& p : ps) alone.push_back(run(solo, {p}, rs)[0]);
    std::mt19937 rng(5);
    int64_t preemptions = 0, accepted = 0;
    for (int mix = 0; mix < 4; ++mix) {
      EngineOptions o = tiny_options(arch);
      o.max_step_tokens = std::uniform_int_distribution<int>(8, 64)(rng);
      o.max_running = std::uniform_int_distribution<int>(2, 8)(rng);
      o.page_tokens = mix % 2 ? 16 : 4;
      o.prefix_caching = mix != 1;
      auto probe = Engine::create(tiny_options(arch));
      ASSERT_TRUE(probe.ok());
      o.kv_memory_bytes = int64_t((*probe)->capacity().bytes_per_token * 140) + 1;
      RunSpec r2 = rs;
      r2.spec = kSpec;
      r2.staggered = true;
      EngineStats st;
      const auto got = run(o, ps, r2, &st);
      expect_same(alone, got, std::string(arch) + " mix " + std::to_string(mix));
      preemptions += st.preemptions;
      accepted += st.spec_accepted_tokens;
    }
    EXPECT_GT(preemptions, 0) << arch;
    EXPECT_GT(accepted, 0) << arch;
  }
}

TEST(Speculative, Int4DecodeWeightsStopStringsAndMaxTokens) {
  // Drafted rows run on the decode weights (INT4 here), as one-token decodes
  // do; a stop string or max_tokens inside an accepted draft ends the request
  // where decoding without drafts ends it.
  EngineOptions o = tiny_options("llama3");
  o.max_step_tokens = 4096;
  o.decode_weights = "int4";
  o.int4_group = 32;
  const auto ps = copying_prompts(6, 21);
  for (int gen : {1, 2, 5, 17}) {
    RunSpec rs;
    rs.gen = gen;
    const auto base = run(o, ps, rs);
    rs.spec = kSpec;
    expect_same(base, run(o, ps, rs), "int4 max_tokens " + std::to_string(gen));
  }
  // Stop on a piece of what the requests print (found from a plain run).
  RunSpec rs;
  rs.gen = 40;
  const auto free_run = run(o, ps, rs);
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string& t = free_run[i].text;
    if (t.size() < 12) continue;
    rs.stop = {t.substr(t.size() / 2, 3)};
    RunSpec sp = rs;
    sp.spec = kSpec;
    const auto a = run(o, {ps[i]}, rs), b = run(o, {ps[i]}, sp);
    expect_same(a, b, "stop " + rs.stop[0]);
    EXPECT_EQ(a[0].finish, FinishReason::Stop);
  }
}

}  // namespace
}  // namespace kvant
