// The engine loop end to end on tiny fixture models (3-4 layers, vocabulary
// 320) and on SmolLM2: agreement with the model's own single-sequence path,
// batch invariance across random mixes, chunk sizes and preemption, FP8
// pages, cancellation, stop handling and integrity faults injected into
// live requests.
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/model_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "kvcache/fault_injector.h"
#include "io/gguf.h"
#include "io/model_files.h"
#include "kvcache/kv_codec.h"
#include "kvcache/page_pool.h"
#include "model/archs/arch.h"
#include "model/model.h"

using namespace kvant;

namespace {

std::string tiny(const std::string& name) {
  return std::string(KVANT_FIXTURES) + "/golden/" + name;
}
std::string smollm2() { return std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::None;
  std::string error;
  int finals = 0;
};

EngineOptions tiny_options(const std::string& arch) {
  EngineOptions o;
  o.model_path = tiny(arch);
  o.tokenizer_path = smollm2();
  o.kv_memory_bytes = int64_t(64) << 20;
  o.log_capacity = false;
  o.debug_invariants = true;
  return o;
}

Request greedy_request(std::vector<int32_t> prompt, int max_tokens, Outcome* out) {
  Request r;
  r.prompt = std::move(prompt);
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  r.on_event = [out](const RequestEvent& e) {
    if (e.token >= 0) out->tokens.push_back(e.token);
    out->text += e.text;
    if (e.finish != FinishReason::None) {
      out->finish = e.finish;
      out->error = std::string(e.error);
      ++out->finals;
    }
  };
  return r;
}

std::vector<std::vector<int32_t>> random_prompts(int n, int min_len, int max_len, int32_t vocab,
                                                 uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> ps;
  for (int i = 0; i < n; ++i) {
    const int len = std::uniform_int_distribution<int>(min_len, max_len)(rng);
    std::vector<int32_t> p;
    for (int j = 0; j < len; ++j)
      p.push_back(std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng));
    ps.push_back(p);
  }
  return ps;
}

// Runs each prompt alone (a fresh engine each, whole-prompt prefill).
std::vector<Outcome> run_alone(const EngineOptions& base,
                               const std::vector<std::vector<int32_t>>& ps, int gen) {
  std::vector<Outcome> out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EngineOptions o = base;
    o.max_step_tokens = 4096;
    auto e = Engine::create(o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
    EXPECT_TRUE((*e)->submit(greedy_request(ps[i], gen, &out[i])).ok());
    EXPECT_TRUE((*e)->run_until_idle().ok());
  }
  return out;
}

}  // namespace

TEST(Engine, MatchesTheModelsSingleSequencePath) {
  // Greedy through the engine (pages, chunked prefill, batched decode) gives
  // the same tokens as a plain loop over Model::forward with its own cache.
  for (const char* arch : {"llama3", "qwen3", "gemma3"}) {
    auto m = Model::load(tiny(arch));
    ASSERT_TRUE(m.ok()) << m.error().message;
    Model& model = **m;
    const auto prompt = random_prompts(1, 40, 40, 320, 7)[0];
    const int gen = 30;  // past gemma3's 12-token window
    SeqKv kv(model.config(), 128);
    std::vector<float> logits(320);
    Batch b;
    b.tokens = prompt;
    b.seqs.push_back({&kv, 0, int64_t(prompt.size()), false});
    std::vector<int32_t> want;
    for (int i = 0; i < gen; ++i) {
      ASSERT_TRUE(model.forward(b, logits).ok());
      const int32_t t = Sampler::argmax(logits);
      want.push_back(t);
      b.tokens = {t};
      b.seqs[0] = {&kv, int64_t(prompt.size()) + i, 1, false};
    }
    EngineOptions o = tiny_options(arch);
    o.max_step_tokens = 16;  // three prefill chunks
    auto e = Engine::create(o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    Outcome out;
    ASSERT_TRUE((*e)->submit(greedy_request(prompt, gen, &out)).ok());
    ASSERT_TRUE((*e)->run_until_idle().ok());
    EXPECT_EQ(out.tokens, want) << arch;
    EXPECT_EQ(out.finish, FinishReason::Length);
    EXPECT_EQ(out.finals, 1);
    EXPECT_EQ(EngineTesting::pool(**e).used_pages(), (*e)->stats().kv_pages_used);
  }
}

TEST(Engine, LatentAttentionAndSparseIndexerThroughThePagePool) {
  // MLA pages (one shared K/V latent row, FP8 with one scale per row) and
  // GLM-5's indexer keys (a block of their own) in the engine's pool: the
  // same greedy tokens as the model's own single-sequence loop, with
  // integrity checks on and prefill split into chunks.
  for (const char* arch : {"deepseek_v3", "glm_moe_dsa_sparse"}) {
    for (bool fp8 : {false, true}) {
      auto m = Model::load(tiny(arch));
      ASSERT_TRUE(m.ok()) << m.error().message;
      Model& model = **m;
      const auto prompt = random_prompts(1, 40, 40, 320, 9)[0];
      const int gen = 20;
      SeqKvOptions kvo;
      if (fp8) {
        kvo.elem = KvDType::kFp8E4m3;
        kvo.dynamic_scales = true;
      }
      SeqKv kv(model.config(), 128, kvo);
      std::vector<float> logits(320);
      Batch b;
      // The prompt in the engine's 16-token chunks (with FP8 pages a later
      // chunk reads the earlier ones back from FP8).
      for (int64_t p0 = 0; p0 + 16 < int64_t(prompt.size()); p0 += 16) {
        b.tokens.assign(prompt.begin() + p0, prompt.begin() + p0 + 16);
        b.seqs = {{&kv, p0, 16, false}};
        ASSERT_TRUE(model.forward(b, logits).ok());
      }
      const int64_t last = (int64_t(prompt.size()) - 1) / 16 * 16;
      b.tokens.assign(prompt.begin() + last, prompt.end());
      b.seqs = {{&kv, last, int64_t(prompt.size()) - last, false}};
      std::vector<int32_t> want;
      for (int i = 0; i < gen; ++i) {
        ASSERT_TRUE(model.forward(b, logits).ok());
        const int32_t t = Sampler::argmax(logits);
        want.push_back(t);
        b.tokens = {t};
        b.seqs[0] = {&kv, int64_t(prompt.size()) + i, 1, false};
      }
      EngineOptions o = tiny_options(arch);
      o.max_step_tokens = 16;
      if (fp8) {
        o.kv_dtype = KvDType::kFp8E4m3;
        o.kv_scale_mode = KvScaleMode::kDynamic;
      }
      auto e = Engine::create(o);
      ASSERT_TRUE(e.ok()) << e.error().message;
      Outcome out;
      ASSERT_TRUE((*e)->submit(greedy_request(prompt, gen, &out)).ok());
      ASSERT_TRUE((*e)->run_until_idle().ok());
      EXPECT_EQ(out.tokens, want) << arch << (fp8 ? " fp8" : " bf16");
      EXPECT_EQ(out.finish, FinishReason::Length);
    }
  }
}

TEST(Engine, BatchInvariantAcrossMixesChunksAndPreemption) {
  // BF16 KV: every request's greedy tokens are bitwise those it gets alone,
  // whatever runs beside it, however its prompt is chunked, and through
  // preemption and recompute.
  for (const char* arch : {"llama3", "gemma3"}) {
    const auto prompts = random_prompts(10, 5, 70, 320, 11);
    const int gen = 20;
    const auto alone = run_alone(tiny_options(arch), prompts, gen);
    std::mt19937 rng(5);
    int64_t preemptions = 0;
    for (int mix = 0; mix < 8; ++mix) {
      EngineOptions o = tiny_options(arch);
      o.max_step_tokens = std::uniform_int_distribution<int>(1, 96)(rng);
      o.max_running = std::uniform_int_distribution<int>(1, 10)(rng);
      o.page_tokens = mix % 2 ? 16 : 4;
      o.prefix_caching = mix % 3 != 0;
      // A pool too small for all at once: preemption. Smallest that still
      // fits one whole sequence (the scheduler refuses ones that never fit).
      o.kv_memory_bytes = 0;
      auto probe = Engine::create(tiny_options(arch));
      ASSERT_TRUE(probe.ok());
      const double bpt = (*probe)->capacity().bytes_per_token;
      const int64_t tokens = mix < 4 ? 160 : 4096;
      o.kv_memory_bytes = int64_t(bpt * double(tokens)) + 1;
      auto e = Engine::create(o);
      ASSERT_TRUE(e.ok()) << e.error().message;
      // Random arrival: some now, some after a few steps.
      std::vector<Outcome> got(prompts.size());
      std::vector<size_t> order(prompts.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      size_t next = 0;
      while (next < order.size() || !(*e)->idle()) {
        const int arrivals = std::uniform_int_distribution<int>(0, 3)(rng);
        for (int a = 0; a < arrivals && next < order.size(); ++a, ++next)
          ASSERT_TRUE(
              (*e)->submit(greedy_request(prompts[order[next]], gen, &got[order[next]])).ok());
        auto r = (*e)->step();
        ASSERT_TRUE(r.ok()) << r.error().message;
      }
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].tokens, alone[i].tokens) << arch << " mix " << mix << " request " << i;
        EXPECT_EQ(got[i].finish, FinishReason::Length);
      }
      preemptions += (*e)->stats().preemptions;
      EXPECT_TRUE((*e)->check_invariants().ok());
      if (!o.prefix_caching) {
        EXPECT_EQ(EngineTesting::pool(**e).used_pages(), 0);
      }
    }
    EXPECT_GT(preemptions, 0) << arch << ": the small pools should have forced preemption";
  }
}

TEST(Engine, Fp8PagesStayCloseToBf16) {
  // FP8 pages change numerics, not behaviour: the run completes, and greedy
  // tokens mostly agree with BF16 pages on a tiny model.
  const auto prompts = random_prompts(4, 20, 40, 320, 3);
  const auto ref = run_alone(tiny_options("llama3"), prompts, 16);
  for (KvDType d : {KvDType::kFp8E4m3, KvDType::kFp8E5m2}) {
    EngineOptions o = tiny_options("llama3");
    o.kv_dtype = d;
    o.kv_scale_mode = KvScaleMode::kDynamic;
    o.max_step_tokens = 24;
    auto e = Engine::create(o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    std::vector<Outcome> got(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i)
      ASSERT_TRUE((*e)->submit(greedy_request(prompts[i], 16, &got[i])).ok());
    ASSERT_TRUE((*e)->run_until_idle().ok());
    int same = 0, total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].tokens.size(), 16u);
      // Count agreement up to the first divergence (afterwards contexts differ).
      for (size_t j = 0; j < 16; ++j, ++total) {
        if (got[i].tokens[j] != ref[i].tokens[j]) break;
        ++same;
      }
    }
    EXPECT_GT(same, 0) << kv_dtype_name(d);
  }
}

TEST(Engine, StaticScalesNeedACalibrationFile) {
  EngineOptions o = tiny_options("llama3");
  o.kv_dtype = KvDType::kFp8E4m3;
  o.kv_scale_mode = KvScaleMode::kStatic;
  o.kv_scales_path = testing::TempDir() + "/missing.kv_scales.json";
  auto e = Engine::create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("calibrate-kv"), std::string::npos) << e.error().message;

  RunnerOptions ro;
  ro.model_path = tiny("llama3");
  auto m = ModelRunner::load(ro);
  ASSERT_TRUE(m.ok());
  const auto toks = random_prompts(1, 300, 300, 320, 9)[0];
  auto s = calibrate_kv_scales(**m, toks, 100);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->tokens, 300);
  for (float a : s->k_amax) EXPECT_GT(a, 0.f);
  const std::string path = testing::TempDir() + "/tiny.kv_scales.json";
  ASSERT_TRUE(save_kv_scales(*s, path).ok());
  auto back = load_kv_scales(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->k_amax, s->k_amax);
  o.kv_scales_path = path;
  auto e2 = Engine::create(o);
  ASSERT_TRUE(e2.ok()) << e2.error().message;
  Outcome out;
  ASSERT_TRUE((*e2)->submit(greedy_request({toks.begin(), toks.begin() + 100}, 8, &out)).ok());
  ASSERT_TRUE((*e2)->run_until_idle().ok());
  EXPECT_EQ(out.tokens.size(), 8u);
}

TEST(Engine, RejectsBadRequestsAndKeepsServing) {
  auto e = Engine::create(tiny_options("llama3"));
  ASSERT_TRUE(e.ok());
  Engine& eng = **e;
  Outcome sink;
  EXPECT_FALSE(eng.submit(greedy_request({}, 4, &sink)).ok());
  auto r = eng.submit(greedy_request({1, 2, 999}, 4, &sink));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("999"), std::string::npos);
  const int64_t ctx = eng.capacity().max_context;
  auto too_long = eng.submit(greedy_request(std::vector<int32_t>(size_t(ctx), 5), 4, &sink));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find(std::to_string(ctx)), std::string::npos)
      << too_long.error().message;
  Request bad = greedy_request({1, 2, 3}, 4, &sink);
  bad.sampling.top_p = 2.f;
  EXPECT_FALSE(eng.submit(bad).ok());
  Outcome ok;
  ASSERT_TRUE(eng.submit(greedy_request({1, 2, 3}, 4, &ok)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  EXPECT_EQ(ok.tokens.size(), 4u);
  // A long request is capped by the context: finish "length" at the limit.
  Outcome capped;
  ASSERT_TRUE(
      eng.submit(greedy_request(std::vector<int32_t>(size_t(ctx - 3), 7), 100, &capped)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  EXPECT_EQ(capped.tokens.size(), 3u);
  EXPECT_EQ(capped.finish, FinishReason::Length);
}

TEST(Engine, CancelReturnsEveryPage) {
  EngineOptions o = tiny_options("llama3");
  o.prefix_caching = false;
  o.max_step_tokens = 8;
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok());
  Engine& eng = **e;
  const auto ps = random_prompts(6, 10, 60, 320, 21);
  std::vector<Outcome> got(ps.size());
  std::vector<RequestId> ids;
  for (size_t i = 0; i < ps.size(); ++i)
    ids.push_back(eng.submit(greedy_request(ps[i], 40, &got[i])).value());
  for (int s = 0; s < 6; ++s) ASSERT_TRUE(eng.step().ok());
  // Mid-prefill, mid-decode and waiting requests alike.
  eng.cancel(ids[0]);
  eng.cancel(ids[3]);
  eng.cancel(ids[5]);
  ASSERT_TRUE(eng.step().ok());
  EXPECT_EQ(got[0].finish, FinishReason::Abort);
  EXPECT_EQ(got[3].finish, FinishReason::Abort);
  for (RequestId id : {ids[1], ids[2], ids[4]}) eng.cancel(id);
  ASSERT_TRUE(eng.run_until_idle().ok());
  EXPECT_EQ(EngineTesting::pool(eng).used_pages(), 0);
  for (auto& g : got) EXPECT_EQ(g.finals, 1);
  EXPECT_EQ(eng.stats().requests_aborted, 6);
}

TEST(Engine, StopStringsAndLogprobs) {
  // The stop string is the text of a token the request will produce: the
  // engine must end there and hide it.
  EngineOptions o;
  o.model_path = smollm2();
  o.kv_memory_bytes = int64_t(32) << 20;
  o.log_capacity = false;
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  Engine& eng = **e;
  const auto p = eng.tokenizer().encode("Once upon a time, in a small village,", true, false);
  Outcome free_run;
  ASSERT_TRUE(eng.submit(greedy_request(p, 12, &free_run)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  ASSERT_EQ(free_run.tokens.size(), 12u);
  std::string piece;
  size_t k = 3;
  for (; k < free_run.tokens.size(); ++k) {
    const int32_t one[1] = {free_run.tokens[k]};
    piece = eng.tokenizer().decode(one);
    const std::string before =
        eng.tokenizer().decode(std::span<const int32_t>(free_run.tokens).first(k));
    // The first occurrence of the token's text is where the token starts.
    if (!piece.empty() && free_run.text.compare(0, before.size(), before) == 0 &&
        free_run.text.find(piece) == before.size())
      break;
  }
  if (k == free_run.tokens.size()) {
    std::string ids;
    for (int32_t t : free_run.tokens) ids += std::to_string(t) + " ";
    FAIL() << "no unique token text to stop on: [" << free_run.text << "] " << ids;
  }
  Outcome stopped;
  Request r = greedy_request(p, 12, &stopped);
  r.stop.stop = {piece};
  r.logprobs = true;
  r.sampling.top_logprobs = 3;
  int lp_events = 0;
  auto inner = r.on_event;
  r.on_event = [&](const RequestEvent& ev) {
    if (ev.token >= 0) {
      ASSERT_NE(ev.logprobs, nullptr);
      EXPECT_EQ(ev.logprobs->n_top, 3);
      EXPECT_EQ(ev.logprobs->chosen.token, ev.token);
      ++lp_events;
    }
    inner(ev);
  };
  ASSERT_TRUE(eng.submit(std::move(r)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  EXPECT_EQ(stopped.finish, FinishReason::Stop);
  EXPECT_EQ(stopped.text, free_run.text.substr(0, free_run.text.find(piece)));
  EXPECT_EQ(lp_events, int(k) + 1);
}

TEST(Engine, IntegrityFaultAbortsOnlyTheVictim) {
  // A live request's page is taken behind its back and handed to someone
  // else; the next step's pass must abort exactly that request, with a
  // message naming the page and both generations, while the others finish
  // with the tokens they get alone.
  for (int fault = 0; fault < 4; ++fault) {
    EngineOptions o = tiny_options("llama3");
    o.prefix_caching = false;
    o.debug_invariants = false;  // the fault breaks invariants on purpose
    auto e = Engine::create(o);
    ASSERT_TRUE(e.ok());
    Engine& eng = **e;
    const auto ps = random_prompts(4, 30, 50, 320, 40 + uint32_t(fault));
    const auto alone = run_alone(tiny_options("llama3"), ps, 12);
    std::vector<Outcome> got(ps.size());
    std::vector<RequestId> ids;
    for (size_t i = 0; i < ps.size(); ++i)
      ids.push_back(eng.submit(greedy_request(ps[i], 12, &got[i])).value());
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(eng.step().ok());
    const uint64_t seq = EngineTesting::sequence_of(eng, ids[1]);
    ASSERT_NE(seq, 0u);
    PageTable* victim = EngineTesting::scheduler(eng).table_for_fault_injection(seq);
    ASSERT_NE(victim, nullptr);
    ASSERT_GE(victim->pages.size(), 2u);
    FaultInjector fi(EngineTesting::pool(eng));
    PageTable thief;
    switch (fault) {
      case 0:
        fi.reassign_page(*victim, 1, thief);
        break;
      case 1:
        fi.flip_generation(*victim, 0, 0x10);
        break;
      case 2:
        ASSERT_TRUE(fi.free_while_referenced(*victim, 1).ok());
        break;
      case 3: {
        // Point the entry at a page of another live request.
        PageTable* other = EngineTesting::scheduler(eng).table_for_fault_injection(EngineTesting::sequence_of(eng, ids[2]));
        fi.redirect_entry(*victim, 0, other->pages[0].page);
        break;
      }
    }
    ASSERT_TRUE(eng.run_until_idle().ok());
    EXPECT_EQ(got[1].finish, FinishReason::Error) << "fault " << fault;
    EXPECT_NE(got[1].error.find("page"), std::string::npos) << got[1].error;
    EXPECT_NE(got[1].error.find("expected generation"), std::string::npos) << got[1].error;
    for (size_t i : {size_t(0), size_t(2), size_t(3)}) {
      EXPECT_EQ(got[i].tokens, alone[i].tokens) << "fault " << fault << " request " << i;
      EXPECT_EQ(got[i].finish, FinishReason::Length);
    }
    EXPECT_GE(eng.stats().integrity_violations, 1);
    EXPECT_EQ(eng.stats().requests_failed, 1);
    // After the abort and the repair, the books balance again and every page
    // comes back.
    EXPECT_TRUE(eng.check_invariants().ok()) << eng.check_invariants().error().message;
    EXPECT_EQ(EngineTesting::pool(eng).used_pages(), 0);
  }
}

TEST(Engine, SmolLM2GreedyMatchesTheSingleSequencePath) {
  const std::string path = smollm2();
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/fetch_model.sh";
  EngineOptions o;
  o.model_path = path;
  o.kv_memory_bytes = int64_t(64) << 20;
  o.log_capacity = false;
  o.max_step_tokens = 32;
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  Engine& eng = **e;
  const std::vector<std::string> texts = {
      "The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"};
  std::vector<Outcome> got(texts.size());
  for (size_t i = 0; i < texts.size(); ++i)
    ASSERT_TRUE(
        eng.submit(greedy_request(eng.tokenizer().encode(texts[i], true, false), 16, &got[i]))
            .ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok());
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto prompt = eng.tokenizer().encode(texts[i], true, false);
    SeqKv kv((*m)->config(), 128);
    std::vector<float> logits(size_t((*m)->config().vocab));
    Batch b;
    b.tokens = prompt;
    b.seqs.push_back({&kv, 0, int64_t(prompt.size()), false});
    std::vector<int32_t> want;
    for (int s = 0; s < 16; ++s) {
      ASSERT_TRUE((*m)->forward(b, logits).ok());
      want.push_back(Sampler::argmax(logits));
      b.tokens = {want.back()};
      b.seqs[0] = {&kv, int64_t(prompt.size()) + s, 1, false};
    }
    EXPECT_EQ(got[i].tokens, want) << texts[i];
  }
}

TEST(Engine, FaultCampaignThroughTheEngine) {
  // 1,000 faults injected into live requests of a running engine (tiny Llama
  // fixture): every faulted request is aborted with an integrity error at the
  // next step, every other request completes with exactly its solo tokens,
  // and no clean step reports a violation.
  const auto prompts = random_prompts(16, 20, 60, 320, 77);
  const int gen = 24;
  const auto solo = run_alone(tiny_options("llama3"), prompts, gen);
  EngineOptions o = tiny_options("llama3");
  o.debug_invariants = false;
  o.prefix_caching = false;
  o.max_step_tokens = 4096;  // every running request is scheduled every step
  o.max_running = 12;
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok());
  Engine& eng = **e;
  std::mt19937 rng(2024);
  struct Live {
    size_t prompt;
    RequestId id;
    Outcome out;
    bool faulted = false;
  };
  std::vector<std::unique_ptr<Live>> all;
  std::vector<Live*> live;
  int faults = 0, detected = 0, clean_completions = 0, steps = 0, clean_steps_with_violations = 0;
  FaultInjector fi(EngineTesting::pool(eng));
  while (faults < 1000) {
    while (live.size() < 10) {
      auto l = std::make_unique<Live>();
      l->prompt = size_t(std::uniform_int_distribution<int>(0, int(prompts.size()) - 1)(rng));
      l->id = eng.submit(greedy_request(prompts[l->prompt], gen, &l->out)).value();
      live.push_back(l.get());
      all.push_back(std::move(l));
    }
    // Fault one running request that holds pages (not before its first step).
    bool injected = false;
    if (steps % 2 == 1) {
      std::vector<Live*> cand;
      for (Live* l : live) {
        const uint64_t seq = EngineTesting::sequence_of(eng, l->id);
        PageTable* t = seq ? EngineTesting::scheduler(eng).table_for_fault_injection(seq) : nullptr;
        if (!l->faulted && t && !t->pages.empty()) cand.push_back(l);
      }
      if (!cand.empty()) {
        Live* v = cand[size_t(std::uniform_int_distribution<int>(0, int(cand.size()) - 1)(rng))];
        PageTable* t = EngineTesting::scheduler(eng).table_for_fault_injection(EngineTesting::sequence_of(eng, v->id));
        const size_t idx =
            size_t(std::uniform_int_distribution<int>(0, int(t->pages.size()) - 1)(rng));
        PageTable thief;
        switch (faults % 4) {
          case 0:
            fi.reassign_page(*t, idx, thief);
            break;
          case 1:
            fi.flip_generation(*t, idx, 1u << std::uniform_int_distribution<int>(0, 31)(rng));
            break;
          case 2:
            ASSERT_TRUE(fi.free_while_referenced(*t, idx).ok());
            break;
          case 3: {
            const uint32_t other = uint32_t(
                std::uniform_int_distribution<int64_t>(0, EngineTesting::pool(eng).num_pages() - 1)(rng));
            if (other == t->pages[idx].page)
              fi.flip_generation(*t, idx, 0x80000000u);
            else
              fi.redirect_entry(*t, idx, other);
            break;
          }
        }
        v->faulted = true;
        ++faults;
        injected = true;
      }
    }
    const int64_t before = eng.stats().integrity_violations;
    ASSERT_TRUE(eng.step().ok());
    ++steps;
    if (!injected && eng.stats().integrity_violations != before) ++clean_steps_with_violations;
    for (size_t i = 0; i < live.size();) {
      Live* l = live[i];
      if (l->out.finals == 0) {
        ++i;
        continue;
      }
      if (l->faulted) {
        EXPECT_EQ(l->out.finish, FinishReason::Error);
        detected += l->out.finish == FinishReason::Error;
      } else {
        EXPECT_EQ(l->out.tokens, solo[l->prompt].tokens) << "a clean request's output changed";
        ++clean_completions;
      }
      live.erase(live.begin() + ptrdiff_t(i));
    }
  }
  while (!eng.idle()) ASSERT_TRUE(eng.step().ok());
  for (Live* l : live) {
    if (l->faulted)
      detected += l->out.finish == FinishReason::Error;
    else
      EXPECT_EQ(l->out.tokens, solo[l->prompt].tokens);
  }
  EXPECT_EQ(detected, faults);
  EXPECT_EQ(clean_steps_with_violations, 0);
  EXPECT_GT(clean_completions, 100);
  EXPECT_TRUE(eng.check_invariants().ok()) << eng.check_invariants().error().message;
  EXPECT_EQ(EngineTesting::pool(eng).used_pages(), 0);
  std::printf(
      "engine fault campaign: %d faults, %d detected, %d clean completions equal to solo runs, %d "
      "steps\n",
      faults, detected, clean_completions, steps);
}

TEST(Engine, PromptLogprobsMatchTheModelAndSkipOnlyWhatTheyMay) {
  // Log-probabilities of a prompt's own tokens (echo with logprobs): the same
  // as log-softmax over the model's all-position logits, through chunked
  // prefill, with a prefix-cache hit capped before prompt_logprobs_from, and
  // with or without generation after them.
  auto m = Model::load(tiny("llama3"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  Model& model = **m;
  const int64_t V = model.config().vocab;
  const auto prompt = random_prompts(1, 45, 45, int32_t(V), 11)[0];
  const int64_t n = int64_t(prompt.size());
  SeqKv kv(model.config(), 128);
  std::vector<float> logits(size_t(n * V));
  Batch b;
  b.tokens = prompt;
  b.seqs.push_back({&kv, 0, n, true});
  ASSERT_TRUE(model.forward(b, logits).ok());
  std::vector<std::vector<double>> ref(static_cast<size_t>(n));  // ref[p]: log-softmax predicting prompt[p]
  for (int64_t p = 1; p < n; ++p)
    log_softmax(std::span<const float>(logits.data() + (p - 1) * V, size_t(V)), ref[size_t(p)]);

  EngineOptions o = tiny_options("llama3");
  o.max_step_tokens = 16;  // prefill in chunks of 16
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  Engine& eng = **e;

  struct Got {
    PromptLogprobs plp;
    int with_plp = 0, events = 0;
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::None;
    int64_t cached = -1, completion = -1;
  };
  auto request = [&](int64_t from, int top, bool prompt_only, int gen, Got* g) {
    Request r;
    r.prompt = prompt;
    r.prompt_logprobs = top;
    r.prompt_logprobs_from = from;
    r.prompt_only = prompt_only;
    r.stop.max_tokens = gen;
    r.stop.ignore_eos = true;
    r.on_event = [g](const RequestEvent& ev) {
      ++g->events;
      if (ev.prompt_logprobs) {
        g->plp = *ev.prompt_logprobs;
        ++g->with_plp;
        EXPECT_EQ(g->events, 1) << "prompt logprobs come with the first event";
      }
      if (ev.token >= 0) g->tokens.push_back(ev.token);
      if (ev.finish != FinishReason::None) {
        g->finish = ev.finish;
        g->cached = ev.cached_tokens;
        g->completion = ev.completion_tokens;
      }
    };
    return r;
  };
  auto check = [&](const Got& g, int64_t from, int top, const char* what) {
    ASSERT_EQ(g.with_plp, 1) << what;
    ASSERT_EQ(g.plp.first, from) << what;
    ASSERT_EQ(g.plp.size(), n - from) << what;
    for (int64_t p = from; p < n; ++p) {
      const int64_t i = p - from;
      const auto& r = ref[size_t(p)];
      EXPECT_EQ(g.plp.chosen[size_t(i)].token, prompt[size_t(p)]);
      EXPECT_NEAR(g.plp.chosen[size_t(i)].logprob, r[size_t(prompt[size_t(p)])], 2e-3)
          << what << " position " << p;
      const auto top_at = g.plp.top_at(i);
      ASSERT_EQ(int(top_at.size()), top) << what;
      for (size_t k = 0; k < top_at.size(); ++k) {
        EXPECT_NEAR(top_at[k].logprob, r[size_t(top_at[k].token)], 2e-3) << what;
        if (k > 0) {
          EXPECT_GE(top_at[k - 1].logprob, top_at[k].logprob) << what;
        }
      }
      // The listed tokens are the most likely ones (up to near-ties).
      std::vector<double> sorted = r;
      std::sort(sorted.rbegin(), sorted.rend());
      if (top > 0) {
        EXPECT_NEAR(top_at[0].logprob, sorted[0], 2e-3) << what;
      }
    }
  };

  // Prompt only, every position, 5 alternatives: nothing generated.
  Got a;
  ASSERT_TRUE(eng.submit(request(1, 5, true, 0, &a)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  check(a, 1, 5, "prompt only");
  EXPECT_TRUE(a.tokens.empty());
  EXPECT_EQ(a.finish, FinishReason::Length);
  EXPECT_EQ(a.completion, 0);
  EXPECT_EQ(a.events, 1);

  // The same prompt again, scored from position 37: the prefix cache may
  // serve full pages up to position 36 (two pages of 16), never beyond.
  Got c;
  ASSERT_TRUE(eng.submit(request(37, 0, true, 0, &c)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  check(c, 37, 0, "from 37 after a cache fill");
  EXPECT_EQ(c.cached, 32);

  // With generation: the prompt's logprobs arrive with the first token, and
  // the tokens are the greedy ones.
  Got d;
  ASSERT_TRUE(eng.submit(request(20, 2, false, 4, &d)).ok());
  Outcome plain;
  ASSERT_TRUE(eng.submit(greedy_request(prompt, 4, &plain)).ok());
  ASSERT_TRUE(eng.run_until_idle().ok());
  check(d, 20, 2, "with generation");
  EXPECT_EQ(d.tokens, plain.tokens);
  EXPECT_EQ(d.finish, FinishReason::Length);

  // Bad values fail alone, naming the field.
  Got bad;
  auto r1 = eng.submit(request(0, 1, true, 0, &bad));
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.error().message.find("prompt_logprobs_from"), std::string::npos);
  auto r2 = eng.submit(request(1, int(V) + 1, true, 0, &bad));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message.find("prompt_logprobs"), std::string::npos);
  EXPECT_EQ(EngineTesting::pool(eng).used_pages(), eng.stats().kv_pages_used);
}

namespace {

TEST(Engine, OpensTheModelFileOnce) {
  // A GGUF with two weight sets resident (BF16 prefill, INT4 decode) and its
  // tokenizer: one parse and mapping of the file, not one per use.
  EngineOptions o;
  o.model_path = smollm2();
  o.prefill_weights = "bf16";
  o.decode_weights = "int4";
  o.kv_memory_bytes = int64_t(16) << 20;
  o.log_capacity = false;
  const int64_t files0 = ModelFiles::opened(), gguf0 = GgufFile::opened();
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(ModelFiles::opened() - files0, 1);
  EXPECT_EQ(GgufFile::opened() - gguf0, 1);
  EXPECT_STREQ((*e)->model_config().arch->name, "llama");
  // A Hugging Face directory: its config.json and safetensors once, no GGUF.
  EngineOptions t = tiny_options("qwen3");
  t.tokenizer_path.clear();
  const int64_t files1 = ModelFiles::opened(), gguf1 = GgufFile::opened();
  auto d = Engine::create(t);
  // The fixture has no tokenizer.json, so creation fails at the tokenizer,
  // after the model loaded from the one opening.
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(ModelFiles::opened() - files1, 1);
  EXPECT_EQ(GgufFile::opened() - gguf1, 0);
}

}  // namespace
