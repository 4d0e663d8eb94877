// Multi-token prediction: the MTP layer's draft logits against a reference
// built from transformers' modules (tools/fixtures/gen_mtp.py) over the
// prefill path and the paged decode path, the load-time checks, and the
// engine's speculative method mtp end to end: tokens bitwise those of an
// engine without it (greedy and seeded, BF16 and FP8 pages, under
// continuous batching with preemption and prefix caching), with a trained
// MTP layer's drafts mostly accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/engine.h"
#include "engine/kv_handoff.h"
#include "model/model.h"
#include "model_test_util.h"

namespace kvant {
namespace {

std::string fixture(const std::string& name) {
  return std::string(KVANT_FIXTURES) + "/mtp/" + name;
}

nlohmann::json meta(const std::string& name) {
  std::ifstream f(fixture(name) + "/ids.json");
  return nlohmann::json::parse(f);
}

std::unique_ptr<Model> load_mtp(const std::string& name, const std::string& backend = "cpu") {
  WeightOptions o;
  o.mtp = true;
  o.backend = backend;
  auto m = Model::load(fixture(name), o);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? std::move(*m) : nullptr;
}

// Each row's max |got - ref| as a fraction of the reference's spread: at
// most `outliers` rows above `tol`, and the argmax the same on every other
// row whose reference top-2 margin exceeds twice that row's error. Outliers
// are for FP8 pages only: top-k expert choice is discontinuous, and where
// two experts' scores are closer than the FP8 pages' error, it picks the
// other one and moves that one position's draft far.
void compare(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab,
             double tol, int outliers, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size());
  double mean = 0, var = 0;
  for (float x : ref) mean += x;
  mean /= double(ref.size());
  for (float x : ref) var += (x - mean) * (x - mean);
  const double sd = std::sqrt(var / double(ref.size()));
  const size_t rows = ref.size() / size_t(vocab);
  std::vector<double> row_max(rows, 0.0);
  int over = 0, mismatched = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * size_t(vocab);
    const float* b = got.data() + r * size_t(vocab);
    for (int64_t v = 0; v < vocab; ++v)
      row_max[r] = std::max(row_max[r], double(std::fabs(a[v] - b[v])));
    if (row_max[r] > tol * sd) {
      ++over;
      continue;
    }
    const int64_t ra = std::max_element(a, a + vocab) - a, rb = std::max_element(b, b + vocab) - b;
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v)
      if (v != ra) second = std::max(second, a[v]);
    if (ra != rb && a[ra] - second > 2 * row_max[r]) ++mismatched;
  }
  EXPECT_LE(over, outliers) << what << ": positions off by more than " << tol << " of the spread";
  EXPECT_EQ(mismatched, 0) << what;
  std::vector<double> sorted = row_max;
  std::sort(sorted.begin(), sorted.end());
  std::printf("[mtp] %s: median position max |diff| %.4f (%.2f%% of logit sd %.3f), %d of %zu "
              "positions above %.1f%%, the largest %.3f\n",
              what.c_str(), sorted[rows / 2], 100 * sorted[rows / 2] / sd, sd, over, rows,
              100 * tol, sorted.back());
}

// Draft logits [n-1, vocab] of ids: the main model over ids in chunks of
// `chunk`, each followed by the MTP layer over the chunk's positions (the
// last position of a chunk waits for the next chunk's first token, as in
// the engine, which knows it from the prompt: here it is fed with the chunk).
std::vector<float> run_mtp(Model& m, const std::vector<int32_t>& ids, int64_t chunk,
                           const SeqKvOptions& kvo = {}) {
  const auto& c = m.config();
  const int64_t n = int64_t(ids.size());
  SeqKv kv(c, n, kvo);
  std::vector<float> main(size_t(chunk * c.vocab)), out(size_t((n - 1) * c.vocab));
  for (int64_t p = 0; p < n - 1; p += chunk) {
    const int64_t k = std::min(chunk, n - 1 - p);
    Batch b;
    b.tokens.assign(ids.begin() + p, ids.begin() + p + k);
    b.seqs.push_back({&kv, p, k, false});
    auto r = m.forward(b, main);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    Batch d;
    d.tokens.assign(ids.begin() + p + 1, ids.begin() + p + 1 + k);
    d.seqs.push_back({&kv, p, k, true});
    const int64_t src = 0;
    r = m.forward_mtp(d, {&src, 1}, std::span<float>(out.data() + p * c.vocab, size_t(k * c.vocab)));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  }
  return out;
}

class MtpTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpTest, DraftLogitsMatchTheReference) {
  // Against FP32 the difference is kvant's BF16 activations compounding
  // through the main model and the MTP layer (bound as the golden tests do,
  // 5% of the spread); the prefill path also against the reference that
  // rounds as kvant does (2.5%; GQA: latent attention rounds other
  // intermediates, as in the golden tests). The decode path (one position
  // at a time, paged attention; latent attention absorbed) and chunks of 7
  // against FP32; FP8 pages looser.
  for (const std::string be : {"cpu", "cpu-scalar"}) {
    auto m = load_mtp(GetParam(), be);
    ASSERT_TRUE(m);
    const auto& c = m->config();
    EXPECT_EQ(c.mtp_layers, 1);
    EXPECT_EQ(c.kv_layers(), c.layers + 1);
    const auto ids = meta(GetParam())["ids"].get<std::vector<int32_t>>();
    const size_t rows = ids.size() - 1;
    const auto ref = test::read_f32(fixture(GetParam()) + "/mtp_logits.f32", rows * size_t(c.vocab));
    const auto ref16 =
        test::read_f32(fixture(GetParam()) + "/mtp_logits_bf16act.f32", rows * size_t(c.vocab));
    const std::string tag = GetParam() + " " + be;
    const auto whole = run_mtp(*m, ids, int64_t(ids.size()));
    compare(ref, whole, c.vocab, 0.05, 0, tag + " prefill vs fp32");
    if (!c.mla()) compare(ref16, whole, c.vocab, 0.025, 0, tag + " prefill vs bf16 recipe");
    compare(ref, run_mtp(*m, ids, 1), c.vocab, 0.05, 0, tag + " decode vs fp32");
    compare(ref, run_mtp(*m, ids, 7), c.vocab, 0.05, 0, tag + " chunks of 7 vs fp32");
    // FP8 pages (3 mantissa bits) move every layer's attention by more than
    // the fixtures' routing gaps (gen_mtp.py keeps them above 2e-3 for
    // BF16): a looser bound, and up to a quarter of the positions may take
    // another expert somewhere (measured: 1 to 10 of 63).
    SeqKvOptions f8;
    f8.elem = KvDType::kFp8E4m3;
    f8.dynamic_scales = true;
    compare(ref, run_mtp(*m, ids, 1, f8), c.vocab, 0.15, 16, tag + " decode, fp8 pages, vs fp32");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpTest,
                         ::testing::Values("deepseek_v3", "glm4_moe", "glm_moe_dsa"));

TEST(Mtp, LoadChecks) {
  // A checkpoint without MTP layers refuses --mtp with the reason.
  WeightOptions o;
  o.mtp = true;
  auto bad = Model::load(std::string(KVANT_FIXTURES) + "/golden/llama3", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("no MTP layer"), std::string::npos) << bad.error().message;
  // Without --mtp the same checkpoint loads its main layers only, and the
  // main logits are the same bits either way (the MTP layer's pages aside).
  auto plain = Model::load(fixture("glm4_moe"));
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ((*plain)->config().mtp_layers, 0);
  EXPECT_EQ((*plain)->config().nextn_layers, 1);
  auto with = load_mtp("glm4_moe");
  ASSERT_TRUE(with);
  const auto ids = meta("glm4_moe")["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(test::run_chunked(**plain, ids, 5), test::run_chunked(*with, ids, 5));
  Batch b;
  std::vector<float> lg(320);
  const int64_t src = 0;
  auto r = (*plain)->forward_mtp(b, {&src, 0}, lg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("without its multi-token-prediction layer"), std::string::npos);
}

// --- the engine -------------------------------------------------------------

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::None;
};

// The engine on a trained fixture (gen_mtp.py), its MTP layer loaded or not.
EngineOptions options(const std::string& name, bool mtp) {
  EngineOptions o;
  o.model_path = fixture(name + "_trained");
  o.tokenizer_path = std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  o.kv_memory_bytes = int64_t(64) << 20;
  o.log_capacity = false;
  o.debug_invariants = true;
  o.mtp = mtp;
  return o;
}

struct RunSpec {
  SpeculativeParams spec;
  SamplingParams sampling;
  int gen = 40;
  bool staggered = false;
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
      r.sampling = rs.sampling;
      r.sampling.seed = 500 + next;
      r.speculative = rs.spec;
      Outcome* oc = &out[next];
      r.on_event = [oc](const RequestEvent& ev) {
        if (ev.token >= 0) oc->tokens.push_back(ev.token);
        oc->text += ev.text;
        if (ev.finish != FinishReason::None) oc->finish = ev.finish;
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

// The trained fixtures' prompts.
std::vector<std::vector<int32_t>> prompts(const std::string& name) {
  return meta(name + "_trained")["prompts"].get<std::vector<std::vector<int32_t>>>();
}

const SpeculativeParams kMtp{1, 2, 4, SpecMethod::kMtp};

void expect_same(const std::vector<Outcome>& a, const std::vector<Outcome>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << what << " request " << i;
    EXPECT_EQ(a[i].text, b[i].text) << what << " request " << i;
    EXPECT_EQ(a[i].finish, b[i].finish) << what << " request " << i;
  }
}

TEST(Mtp, EngineOutputIsBitwiseTheSameWithMtpDrafts) {
  for (const char* name : {"deepseek_v3", "glm4_moe", "glm_moe_dsa"}) {
    const auto ps = prompts(name);
    for (bool fp8 : {false, true}) {
      for (bool sample : {false, true}) {
        EngineOptions base_o = options(name, false), mtp_o = options(name, true);
        for (auto* o : {&base_o, &mtp_o}) {
          o->max_step_tokens = 4096;
          if (fp8) o->kv_dtype = KvDType::kFp8E4m3;
        }
        RunSpec rs;
        if (sample) {
          rs.sampling.temperature = 0.9f;
          rs.sampling.top_p = 0.95f;
        }
        const auto base = run(base_o, ps, rs);
        // One draft token per step, and three (the layer chained on itself).
        for (int depth : {1, 3}) {
          rs.spec = kMtp;
          rs.spec.num_tokens = depth;
          EngineStats st;
          const auto spec = run(mtp_o, ps, rs, &st);
          const std::string what = std::string(name) + (fp8 ? " fp8" : " bf16") +
                                   (sample ? " sampled" : " greedy") + " depth " +
                                   std::to_string(depth);
          expect_same(base, spec, what);
          EXPECT_GT(st.spec_draft_tokens, 0) << what;
          EXPECT_LE(st.spec_accepted_tokens, st.spec_draft_tokens) << what;
          std::printf("[mtp] %s: %lld drafts, %lld accepted, %lld steps\n", what.c_str(),
                      (long long)st.spec_draft_tokens, (long long)st.spec_accepted_tokens,
                      (long long)st.steps);
          // The trained layer predicts the fixture's greedy continuations
          // (one position ahead: it was not trained on its own output, and
          // tiny DeepSeek-V3's chained drafts are mostly wrong; measured
          // 52% to 99% at depth 1 -- BF16 decoding leaves the continuations
          // it was trained on sooner for some models).
          if (!sample && depth == 1) {
            EXPECT_GT(st.spec_accepted_tokens * 4, st.spec_draft_tokens) << what;
          }
        }
      }
    }
  }
}

TEST(Mtp, UnderContinuousBatchingPreemptionAndPrefixCaching) {
  // GQA (latent attention's prefill and decode round differently, so its
  // tokens depend on the chunking): every request's tokens are those of its
  // solo run without drafts, whatever the step budget, the pool (small enough
  // to preempt), the page size and the prefix cache; prompts share a prefix.
  const std::string name = "glm4_moe";
  auto ps = prompts(name);
  for (size_t i = 1; i < ps.size(); ++i)  // a shared first page (4-token pages)
    std::copy(ps[0].begin(), ps[0].begin() + 5, ps[i].begin());
  for (size_t i = 0; i < 4; ++i) ps.push_back(ps[i]);  // and whole repeats
  RunSpec rs;
  rs.gen = 36;
  std::vector<Outcome> alone;
  for (const auto& p : ps) alone.push_back(run(options(name, false), {p}, rs)[0]);
  std::mt19937 rng(9);
  int64_t preemptions = 0, accepted = 0;
  for (int mix = 0; mix < 4; ++mix) {
    EngineOptions o = options(name, true);
    o.max_step_tokens = std::uniform_int_distribution<int>(6, 40)(rng);
    o.max_running = std::uniform_int_distribution<int>(2, 6)(rng);
    o.page_tokens = mix % 2 ? 16 : 4;
    o.prefix_caching = mix != 1;
    auto probe = Engine::create(options(name, true));
    ASSERT_TRUE(probe.ok());
    o.kv_memory_bytes = int64_t((*probe)->capacity().bytes_per_token * 120) + 1;
    RunSpec r2 = rs;
    r2.spec = kMtp;
    r2.spec.num_tokens = mix % 2 ? 1 : 4;  // chained drafts across 4-token pages
    r2.staggered = true;
    EngineStats st;
    const auto got = run(o, ps, r2, &st);
    expect_same(alone, got, name + " mix " + std::to_string(mix));
    preemptions += st.preemptions;
    accepted += st.spec_accepted_tokens;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(accepted, 0);
}

TEST(Mtp, AHandoffCarriesTheMtpRows) {
  // Disaggregated: a prefill engine hands each prompt's pages over after
  // its first token, a decode engine drafts with the MTP layer from them.
  // The pages must hold the MTP layer's rows for the whole prompt (the MTP
  // pass runs after the draw; the final event waits for it) and the prefill
  // side's first draft: the decode side then drafts and accepts exactly
  // what one engine doing both does, and its tokens are that engine's.
  for (const char* name : {"glm4_moe", "deepseek_v3", "glm_moe_dsa"}) {
    const auto ps = prompts(name);
    const int gen = 24;
    auto one = Engine::create(options(name, true));
    auto pre = Engine::create(options(name, true));
    auto dec = Engine::create(options(name, true));
    ASSERT_TRUE(one.ok() && pre.ok() && dec.ok());
    struct Out {
      std::vector<int32_t> tokens;
      std::shared_ptr<KvHandoff> handoff;
    };
    std::vector<Out> want(ps.size()), first(ps.size()), got(ps.size());
    auto request = [&](size_t i, Out* o) {
      Request r;
      r.prompt = ps[i];
      r.stop.max_tokens = gen;
      r.stop.ignore_eos = true;
      r.speculative = kMtp;
      r.on_event = [o](const RequestEvent& e) {
        if (e.token >= 0) o->tokens.push_back(e.token);
        if (e.finish != FinishReason::None && e.handoff)
          o->handoff = std::make_shared<KvHandoff>(*e.handoff);
      };
      return r;
    };
    // One request at a time on each side, so that the two runs batch alike.
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_TRUE((*one)->submit(request(i, &want[i])).ok());
      ASSERT_TRUE((*one)->run_until_idle().ok());
      Request r = request(i, &first[i]);
      r.handoff = true;
      ASSERT_TRUE((*pre)->submit(std::move(r)).ok());
      ASSERT_TRUE((*pre)->run_until_idle().ok());
      ASSERT_TRUE(first[i].handoff) << name << " " << i;
      {
        // The MTP layer's K row (its pages' last layer; BF16 pages, K
        // first) of every prompt position is written: a fresh engine's
        // arena is zeros.
        const KvHandoff& h = *first[i].handoff;
        const ModelConfig& c = (*pre)->model_config();
        const int64_t layer_bytes = h.page_bytes / c.kv_layers();
        const int64_t row = c.cache_heads() * c.cache_dim() * 2;
        int64_t unwritten = 0;
        for (int64_t p = 0; p < int64_t(ps[i].size()); ++p) {
          const uint8_t* k = h.data.data() + (p / h.page_tokens) * h.page_bytes +
                             (c.kv_layers() - 1) * layer_bytes + (p % h.page_tokens) * row;
          unwritten += std::all_of(k, k + row, [](uint8_t b) { return b == 0; });
        }
        EXPECT_EQ(unwritten, 0) << name << " prompt " << i << ": MTP rows missing from the handoff";
      }
      ASSERT_TRUE((*dec)->submit_handoff(request(i, &got[i]), first[i].handoff).ok());
      ASSERT_TRUE((*dec)->run_until_idle().ok());
      EXPECT_EQ(got[i].tokens, want[i].tokens) << name << " prompt " << i;
    }
    const EngineStats a = (*one)->stats(), b = (*dec)->stats();
    EXPECT_EQ(a.spec_draft_tokens, b.spec_draft_tokens) << name;
    EXPECT_EQ(a.spec_accepted_tokens, b.spec_accepted_tokens) << name;
    EXPECT_GT(b.spec_accepted_tokens, 0) << name;
    std::printf("[mtp] %s handoff: %lld drafts, %lld accepted (one engine: %lld, %lld)\n", name,
                (long long)b.spec_draft_tokens, (long long)b.spec_accepted_tokens,
                (long long)a.spec_draft_tokens, (long long)a.spec_accepted_tokens);
  }
}

TEST(Mtp, RequestsAskingForMtpNeedAnEngineWithIt) {
  auto e = Engine::create(options("glm4_moe", false));
  ASSERT_TRUE(e.ok()) << e.error().message;
  Request r;
  r.prompt = prompts("glm4_moe")[0];
  r.speculative = kMtp;
  auto s = (*e)->submit(std::move(r));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("--mtp"), std::string::npos) << s.error().message;
  SpeculativeParams many = kMtp;
  many.num_tokens = 17;
  EXPECT_FALSE(check_speculative_params(many).ok());
}

}  // namespace
}  // namespace kvant
