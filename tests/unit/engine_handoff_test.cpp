// Disaggregated prefill and decode inside the engine (engine/kv_handoff.h):
// one engine runs the prompt and hands its pages over, another generates
// from them. Greedy and seeded tokens equal one engine doing both with the
// same per-phase weights (BF16 prefill, INT4 decode; BF16 and FP8 pages);
// a corrupted byte, another layout, a wrong prompt are refused with
// messages; a full decode pool makes imports wait (back-pressure) and they
// all finish; every page comes back.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_handoff.h"

using namespace kvant;

namespace {

std::string smollm2() { return std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

EngineOptions options(const std::string& prefill, const std::string& decode, KvDType kv) {
  EngineOptions o;
  o.model_path = smollm2();
  o.prefill_weights = prefill;
  o.decode_weights = decode;
  o.kv_dtype = kv;
  o.kv_scale_mode = kv == KvDType::kBf16 ? KvScaleMode::kNone : KvScaleMode::kDynamic;
  o.kv_memory_bytes = int64_t(32) << 20;
  o.log_capacity = false;
  o.debug_invariants = true;
  o.threads = 2;
  return o;
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::None;
  std::string error;
  std::shared_ptr<KvHandoff> handoff;  // the prefill side's final event's
};

Request request(const std::vector<int32_t>& prompt, int max_tokens, uint64_t seed, Outcome* out) {
  Request r;
  r.prompt = prompt;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  if (seed != 0) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = seed;
  }
  r.on_event = [out](const RequestEvent& e) {
    if (e.token >= 0) out->tokens.push_back(e.token);
    if (e.finish != FinishReason::None) {
      out->finish = e.finish;
      out->error = std::string(e.error);
      if (e.handoff) out->handoff = std::make_shared<KvHandoff>(*e.handoff);
    }
  };
  return r;
}

std::vector<std::vector<int32_t>> prompts(const Engine& e) {
  std::vector<std::vector<int32_t>> ps;
  for (const char* text : {"The capital of France is", "Write a short poem about the sea.",
                           "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,"})
    ps.push_back(e.tokenizer().encode(text, true, false));
  return ps;
}

std::unique_ptr<Engine> make(const EngineOptions& o) {
  auto e = Engine::create(o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  return e.ok() ? std::move(*e) : nullptr;
}

// Prefill on `pre`, decode on `dec`, each prompt handed over; returns the
// decode side's outcomes (the first token is the prefill side's).
std::vector<Outcome> disaggregated(Engine& pre, Engine& dec,
                                   const std::vector<std::vector<int32_t>>& ps, int gen,
                                   uint64_t seed) {
  std::vector<Outcome> first(ps.size()), out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    Request r = request(ps[i], gen, seed ? seed + i : 0, &first[i]);
    r.handoff = true;
    EXPECT_TRUE(pre.submit(std::move(r)).ok());
  }
  EXPECT_TRUE(pre.run_until_idle().ok());
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(first[i].tokens.size(), 1u);
    EXPECT_EQ(first[i].finish, FinishReason::Length);
    EXPECT_TRUE(first[i].handoff) << i;
    if (!first[i].handoff) continue;
    EXPECT_EQ(first[i].handoff->first_token, first[i].tokens[0]);
    auto id = dec.submit_handoff(request(ps[i], gen, seed ? seed + i : 0, &out[i]),
                                 first[i].handoff);
    EXPECT_TRUE(id.ok()) << id.error().message;
  }
  EXPECT_TRUE(dec.run_until_idle().ok());
  return out;
}

std::vector<Outcome> colocated(Engine& e, const std::vector<std::vector<int32_t>>& ps, int gen,
                               uint64_t seed) {
  std::vector<Outcome> out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_TRUE(e.submit(request(ps[i], gen, seed ? seed + i : 0, &out[i])).ok());
  EXPECT_TRUE(e.run_until_idle().ok());
  return out;
}

}  // namespace

TEST(EngineHandoff, EqualsOneEngineWithTheSamePhaseWeights) {
  const int gen = 24;
  for (KvDType kv : {KvDType::kBf16, KvDType::kFp8E4m3}) {
    for (uint64_t seed : {uint64_t(0), uint64_t(77)}) {
      auto pre = make(options("bf16", "bf16", kv));
      auto dec = make(options("int4", "int4", kv));
      auto both = make(options("bf16", "int4", kv));
      ASSERT_TRUE(pre && dec && both);
      const auto ps = prompts(*both);
      const auto want = colocated(*both, ps, gen, seed);
      const auto got = disaggregated(*pre, *dec, ps, gen, seed);
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(got[i].finish, FinishReason::Length) << got[i].error;
        EXPECT_EQ(got[i].tokens, want[i].tokens)
            << "prompt " << i << ", " << kv_dtype_name(kv) << ", seed " << seed;
        EXPECT_EQ(int(got[i].tokens.size()), gen);
      }
      const EngineStats s = dec->stats();
      EXPECT_EQ(s.kv_handoffs_in, int64_t(ps.size()));
      EXPECT_EQ(pre->stats().kv_handoffs_out, int64_t(ps.size()));
      EXPECT_EQ(s.kv_pages_used, s.kv_pages_cached);  // only the prefix index holds pages
      EXPECT_TRUE(dec->check_invariants().ok());
    }
  }
}

TEST(EngineHandoff, RefusesCorruptionOtherLayoutsAndWrongPrompts) {
  auto pre = make(options("bf16", "bf16", KvDType::kFp8E4m3));
  auto dec = make(options("bf16", "bf16", KvDType::kFp8E4m3));
  auto bf16 = make(options("bf16", "bf16", KvDType::kBf16));
  ASSERT_TRUE(pre && dec && bf16);
  const auto ps = prompts(*dec);
  Outcome first, out;
  Request r = request(ps[1], 8, 0, &first);
  r.handoff = true;
  ASSERT_TRUE(pre->submit(std::move(r)).ok());
  ASSERT_TRUE(pre->run_until_idle().ok());
  ASSERT_TRUE(first.handoff);

  auto flipped = std::make_shared<KvHandoff>(*first.handoff);
  flipped->data[flipped->data.size() / 2] ^= 0x10;
  auto a = dec->submit_handoff(request(ps[1], 8, 0, &out), flipped);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("checksum"), std::string::npos) << a.error().message;

  auto b = bf16->submit_handoff(request(ps[1], 8, 0, &out), first.handoff);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("layout"), std::string::npos) << b.error().message;
  EXPECT_NE(kv_layout_difference(bf16->kv_layout(), dec->kv_layout()).find("dtype"),
            std::string::npos);

  auto c = dec->submit_handoff(request(ps[0], 8, 0, &out), first.handoff);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("prompt"), std::string::npos) << c.error().message;

  auto d = dec->submit_handoff(request(ps[1], 1, 0, &out), first.handoff);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("max_tokens"), std::string::npos) << d.error().message;

  EXPECT_EQ(dec->stats().kv_handoffs_refused, 3);
  EXPECT_EQ(bf16->stats().kv_handoffs_refused, 1);
  // The intact one is taken.
  Outcome ok;
  ASSERT_TRUE(dec->submit_handoff(request(ps[1], 8, 0, &ok), first.handoff).ok());
  ASSERT_TRUE(dec->run_until_idle().ok());
  EXPECT_EQ(ok.finish, FinishReason::Length) << ok.error;
  EXPECT_EQ(ok.tokens.size(), 8u);
}

TEST(EngineHandoff, AFullDecodePoolMakesImportsWait) {
  // A decode pool of 24 pages of 16 tokens; 12 imports of 20-token prompts
  // generating 40 tokens each need 4 pages apiece: at most 6 run at once,
  // the rest wait in order, and all finish with every page back.
  EngineOptions po = options("bf16", "bf16", KvDType::kBf16);
  EngineOptions dopt = po;
  auto pre = make(po);
  ASSERT_TRUE(pre);
  const int64_t page_bytes = int64_t(pre->capacity().arena_bytes / pre->capacity().pages);
  dopt.kv_memory_bytes = 24 * page_bytes;
  dopt.prefix_caching = false;
  auto dec = make(dopt);
  ASSERT_TRUE(dec);
  ASSERT_EQ(dec->capacity().pages, 24);
  std::vector<std::vector<int32_t>> ps;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 20; ++j) p.push_back(1000 + 37 * i + j);
    ps.push_back(p);
  }
  std::vector<Outcome> first(ps.size()), out(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    Request r = request(ps[i], 40, 0, &first[i]);
    r.handoff = true;
    ASSERT_TRUE(pre->submit(std::move(r)).ok());
  }
  ASSERT_TRUE(pre->run_until_idle().ok());
  for (size_t i = 0; i < ps.size(); ++i)
    ASSERT_TRUE(dec->submit_handoff(request(ps[i], 40, 0, &out[i]), first[i].handoff).ok());
  int64_t most_waiting = 0;
  while (!dec->idle()) {
    ASSERT_TRUE(dec->step().ok());
    most_waiting = std::max(most_waiting, dec->stats().kv_imports_waiting);
  }
  EXPECT_GT(most_waiting, 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(out[i].finish, FinishReason::Length) << i << ": " << out[i].error;
    EXPECT_EQ(out[i].tokens.size(), 40u);
  }
  EXPECT_EQ(dec->stats().kv_pages_used, 0);
  EXPECT_TRUE(dec->check_invariants().ok());
}
