// Token masks over SmolLM2's vocabulary (grammar/token_constraint.h): the
// trie walk agrees with checking every token by itself, special tokens come
// only where the grammar names them, and random walks through the masks end
// in outputs that parse and fit their schema.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>

#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/token_constraint.h"
#include "tokenizer_test_util.h"

namespace kvant::grammar {
namespace {

using ojson = nlohmann::ordered_json;

const Tokenizer* smollm2() {
  std::string why;
  const Tokenizer* t = testing::gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf", &why);
  if (!t) std::fprintf(stderr, "SmolLM2 tokenizer: %s\n", why.c_str());
  return t;
}

std::shared_ptr<CompiledConstraint> compile(const Tokenizer& tok, const std::string& schema,
                                            std::shared_ptr<Grammar>* out = nullptr) {
  auto g = std::make_shared<Grammar>();
  auto r = compile_json_schema(ojson::parse(schema), *g);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  EXPECT_TRUE(g->finish(*r).ok());
  if (out) *out = g;
  return std::make_shared<CompiledConstraint>(g, VocabIndex::build(tok));
}

std::vector<float> masked(TokenConstraint& c, int32_t vocab) {
  std::vector<float> logits(size_t(vocab), 0.f);
  EXPECT_TRUE(c.mask(logits).ok());
  return logits;
}

const char* kPerson = R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
    "age":{"type":"integer","minimum":0,"maximum":150},"city":{"enum":["Paris","Oslo"]}},
    "required":["name","age","city"],"additionalProperties":false})";

TEST(GrammarMask, TrieWalkEqualsTokenByToken) {
  const Tokenizer* tok = smollm2();
  if (!tok) GTEST_SKIP() << "no SmolLM2 model (scripts/fetch_model.sh)";
  std::shared_ptr<Grammar> g;
  auto cc = compile(*tok, kPerson, &g);
  auto c = cc->start();
  ASSERT_TRUE(c.ok());
  Matcher ref(g);
  const std::string text = R"({"name": "Zoë", "age": 41, "city": "Oslo"})";
  const std::vector<int32_t> ids = tok->encode(text, false);
  int32_t state = ref.start();
  const int32_t vocab = tok->vocab_size();
  for (size_t step = 0; step <= ids.size(); ++step) {
    const auto logits = masked(**c, vocab);
    int allowed = 0;
    for (int32_t t = 0; t < vocab; ++t) {
      bool expect;
      if (tok->is_special(t)) {
        expect = tok->is_eog(t) && ref.accepting(state);
      } else {
        const std::string& p = tok->token_piece(t);
        const int32_t s = p.empty() ? -1 : ref.step_bytes(state, p);
        expect = s >= 0;
      }
      allowed += expect;
      ASSERT_EQ(std::isfinite(logits[size_t(t)]), expect)
          << "step " << step << " token " << t << " '" << tok->token_piece(t) << "'";
    }
    EXPECT_GT(allowed, 0);
    if (step == ids.size()) break;
    ASSERT_TRUE((*c)->accept(ids[step]).ok()) << "token " << step;
    state = ref.step_bytes(state, tok->token_piece(ids[step]));
    ASSERT_GE(state, 0);
  }
  EXPECT_TRUE(ref.accepting(state));
  // A token the mask refused is refused by accept() too.
  auto fresh = cc->start();
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE((*fresh)->accept(tok->encode("x", false)[0]).ok());
}

TEST(GrammarMask, RandomWalksEndInValidJson) {
  const Tokenizer* tok = smollm2();
  if (!tok) GTEST_SKIP() << "no SmolLM2 model (scripts/fetch_model.sh)";
  auto cc = compile(*tok, kPerson);
  const int32_t vocab = tok->vocab_size();
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.f, 1.f);
  std::vector<float> pool(size_t(vocab) * 4);  // noise read from random offsets
  for (auto& x : pool) x = noise(rng);
  int finished = 0;
  for (int walk = 0; walk < 12; ++walk) {
    auto c = cc->start();
    ASSERT_TRUE(c.ok());
    std::vector<int32_t> out;
    for (int step = 0; step < 200; ++step) {
      const size_t off = rng() % (pool.size() - size_t(vocab));
      std::vector<float> logits(pool.begin() + long(off), pool.begin() + long(off) + vocab);
      // Favour short tokens that close things, so walks end.
      for (int32_t t = 0; t < vocab; ++t) {
        const std::string& p = tok->token_piece(t);
        if (p.find('"') != std::string::npos || p.find('}') != std::string::npos) logits[size_t(t)] += 2.5f;
      }
      for (int32_t e : tok->eog_ids()) logits[size_t(e)] += 50.f;
      ASSERT_TRUE((*c)->mask(logits).ok());
      const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ASSERT_TRUE(std::isfinite(logits[size_t(t)]));
      ASSERT_TRUE((*c)->accept(t).ok());
      if (tok->is_eog(t)) break;
      out.push_back(t);
    }
    const std::string text = tok->decode(out);
    if (!cc->accepts(text)) continue;  // ran out of steps
    ++finished;
    const ojson j = ojson::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_EQ(j.size(), 3u) << text;
    EXPECT_TRUE(j["name"].is_string() && j["name"].get<std::string>().size() <= 12 * 4) << text;
    EXPECT_TRUE(j["age"].is_number_integer() && j["age"].get<int>() >= 0 && j["age"].get<int>() <= 150) << text;
    EXPECT_TRUE(j["city"] == "Paris" || j["city"] == "Oslo") << text;
  }
  EXPECT_GE(finished, 8);
}

TEST(GrammarMask, SpecialTokensOnlyWhereNamed) {
  const Tokenizer* tok = smollm2();
  if (!tok) GTEST_SKIP() << "no SmolLM2 model (scripts/fetch_model.sh)";
  auto vocab = VocabIndex::build(*tok);
  auto im_start = vocab->special_token("<|im_start|>");
  ASSERT_TRUE(im_start.has_value());
  auto g = std::make_shared<Grammar>();
  const int32_t r = g->add_rule("root");
  ASSERT_TRUE(g->define(r, Expr::seq({Expr::lit("a"), Expr::token(*im_start), Expr::lit("b")})).ok());
  ASSERT_TRUE(g->finish(r).ok());
  auto cc = std::make_shared<CompiledConstraint>(g, vocab);
  auto c = cc->start();
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->accept(tok->encode("a", false)[0]).ok());
  const auto logits = masked(**c, tok->vocab_size());
  int allowed = 0;
  for (int32_t t = 0; t < tok->vocab_size(); ++t) allowed += std::isfinite(logits[size_t(t)]);
  EXPECT_EQ(allowed, 1);
  EXPECT_TRUE(std::isfinite(logits[size_t(*im_start)]));
  ASSERT_TRUE((*c)->accept(*im_start).ok());
  ASSERT_TRUE((*c)->accept(tok->encode("b", false)[0]).ok());
  const auto end = masked(**c, tok->vocab_size());
  for (int32_t t = 0; t < tok->vocab_size(); ++t) EXPECT_EQ(std::isfinite(end[size_t(t)]), tok->is_eog(t)) << t;
}

// How long masks take on this machine: a miss walks the trie, a hit is a
// look-up and one pass over the logits. Printed for docs/API.md; the bound
// is loose (a miss must not take a decode step's time).
TEST(GrammarMask, Cost) {
  const Tokenizer* tok = smollm2();
  if (!tok) GTEST_SKIP() << "no SmolLM2 model (scripts/fetch_model.sh)";
  auto cc = compile(*tok, R"({"type":"object","properties":{"text":{"type":"string"}},"required":["text"]})");
  auto c = cc->start();
  ASSERT_TRUE(c.ok());
  for (int32_t t : tok->encode("{\"text\": \"", false)) ASSERT_TRUE((*c)->accept(t).ok());
  std::vector<float> logits(size_t(tok->vocab_size()), 0.f);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*c)->mask(logits).ok());
  auto t1 = std::chrono::steady_clock::now();
  const int reps = 200;
  for (int i = 0; i < reps; ++i) {
    std::fill(logits.begin(), logits.end(), 0.f);
    ASSERT_TRUE((*c)->mask(logits).ok());
  }
  auto t2 = std::chrono::steady_clock::now();
  const double miss_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double hit_us = std::chrono::duration<double, std::micro>(t2 - t1).count() / reps;
  std::printf("vocab %d, trie nodes %zu: mask miss %.2f ms, hit %.1f us\n", tok->vocab_size(),
              cc->vocab().trie_nodes(), miss_ms, hit_us);
  EXPECT_LT(miss_ms, 500.0);
  EXPECT_LT(hit_us, 2000.0);
}

}  // namespace
}  // namespace kvant::grammar
