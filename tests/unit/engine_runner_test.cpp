// ModelRunner (engine/model_runner.h), the tools' way to a model: its
// forward is the model's own, bit for bit, over mixed batches (prefill with
// skipped logit rows beside a decode); its weight sets and their reports are
// the model's for the same precision strings the engine takes; bad strings
// fail at load; and once its workspace and batch have grown, a decode step
// allocates nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "alloc_counter.h"
#include "engine/model_runner.h"
#include "model/model.h"

namespace kvant {
namespace {

std::string fixture(const std::string& name) {
  return std::string(KVANT_FIXTURES) + "/golden/" + name;
}

std::vector<int32_t> ids(int n, int64_t vocab, int salt) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(int32_t((i * 31 + salt * 17 + 5) % vocab));
  return v;
}

TEST(ModelRunner, ForwardIsTheModelsBitForBit) {
  RunnerOptions ro;
  ro.model_path = fixture("llama3");
  auto r = ModelRunner::load(ro);
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto m = Model::load(fixture("llama3"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  ModelRunner& runner = **r;
  Model& model = **m;
  const ModelConfig& c = runner.config();
  ASSERT_EQ(c.vocab, model.config().vocab);
  const int64_t V = c.vocab;
  const auto a = ids(24, V, 1), b = ids(20, V, 2);
  SeqKv ra(c, 64), rb(c, 64), ma(c, 64), mb(c, 64);
  std::vector<float> got, want;
  // Step 1: a's whole prompt (every row but the first 5) beside b's first 19.
  // Step 2: a decodes one token beside b's last token (last row only).
  for (int step = 0; step < 2; ++step) {
    std::vector<RunChunk> chunks;
    if (step == 0) {
      chunks.push_back({&ra, 0, std::span<const int32_t>(a).first(23), true, 5});
      chunks.push_back({&rb, 0, std::span<const int32_t>(b).first(19), false});
    } else {
      chunks.push_back({&ra, 23, std::span<const int32_t>(a).subspan(23, 1), false});
      chunks.push_back({&rb, 19, std::span<const int32_t>(b).subspan(19, 1), true});
    }
    Batch batch;
    const SeqKv* mkv[2] = {&ma, &mb};
    for (size_t i = 0; i < chunks.size(); ++i) {
      const RunChunk& ch = chunks[i];
      batch.tokens.insert(batch.tokens.end(), ch.tokens.begin(), ch.tokens.end());
      batch.seqs.push_back(
          {mkv[i], ch.pos0, int64_t(ch.tokens.size()), ch.all_logits, ch.logit_skip});
    }
    ASSERT_EQ(logit_rows(chunks), batch.logit_rows());
    got.assign(size_t(logit_rows(chunks) * V), 0.f);
    want.assign(got.size(), 1.f);
    ASSERT_TRUE(runner.forward(chunks, got).ok());
    ASSERT_TRUE(model.forward(batch, want).ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "step " << step;
  }
  // A single chunk, and a buffer too small.
  std::vector<float> one(static_cast<size_t>(V));
  const int32_t t = a[0];
  EXPECT_TRUE(runner.forward(RunChunk{&ra, 24, std::span<const int32_t>(&t, 1)}, one).ok());
  std::vector<float> small(size_t(V) - 1);
  EXPECT_FALSE(runner.forward(RunChunk{&ra, 25, std::span<const int32_t>(&t, 1)}, small).ok());
}

TEST(ModelRunner, WeightSetsAreTheModelsForTheSameStrings) {
  RunnerOptions ro;
  ro.model_path = fixture("llama3");
  ro.prefill_weights = "bf16";
  ro.decode_weights = "int4";
  ro.int4_group = 32;
  auto r = ModelRunner::load(ro);
  ASSERT_TRUE(r.ok()) << r.error().message;
  WeightOptions wo;
  wo.prefill = WeightPrecision::kBf16;
  wo.decode = WeightPrecision::kInt4;
  wo.int4_group = 32;
  auto m = Model::load(fixture("llama3"), wo);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const ModelRunner& runner = **r;
  const Model& model = **m;
  EXPECT_NE(runner.prefill_set(), runner.decode_set());
  EXPECT_EQ(runner.prefill_set(), model.prefill_set());
  EXPECT_EQ(runner.decode_set(), model.decode_set());
  for (int s : {runner.prefill_set(), runner.decode_set()}) {
    EXPECT_EQ(runner.set_precision(s), model.set_precision(s)) << s;
    EXPECT_EQ(runner.set_bytes(s), model.set_bytes(s)) << s;
  }
  EXPECT_EQ(runner.set_precision(runner.prefill_set()), "bf16");
}

TEST(ModelRunner, BadOptionsFailAtLoad) {
  RunnerOptions ro;
  ro.model_path = fixture("llama3");
  ro.decode_weights = "fp4";
  auto r = ModelRunner::load(ro);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'fp4'"), std::string::npos) << r.error().message;
  ro.decode_weights = "native";
  ro.int4_group = 48;
  r = ModelRunner::load(ro);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("48"), std::string::npos) << r.error().message;
  ro.int4_group = 128;
  ro.backend = "no-such-backend";
  r = ModelRunner::load(ro);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no-such-backend"), std::string::npos) << r.error().message;
}

TEST(ModelRunner, DecodeStepAllocatesNothingOnceWarm) {
  RunnerOptions ro;
  ro.model_path = fixture("llama3");
  auto r = ModelRunner::load(ro);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ModelRunner& runner = **r;
  const ModelConfig& c = runner.config();
  constexpr int64_t kSeqs = 3, kCtx = 40;
  runner.reserve(16, kCtx);
  std::vector<std::unique_ptr<SeqKv>> kv;
  for (int i = 0; i < kSeqs; ++i) kv.push_back(std::make_unique<SeqKv>(c, kCtx));
  std::vector<float> logits(size_t(kSeqs * c.vocab));
  std::vector<int32_t> toks(kSeqs);
  std::vector<RunChunk> chunks(kSeqs);
  for (int64_t pos = 0; pos < kCtx - 1; ++pos) {
    for (int i = 0; i < kSeqs; ++i) {
      toks[size_t(i)] = int32_t((pos * 7 + i * 13) % c.vocab);
      chunks[size_t(i)] = {kv[size_t(i)].get(), pos,
                           std::span<const int32_t>(toks).subspan(size_t(i), 1), false};
    }
    testing::AllocCounter count;
    auto res = runner.forward(chunks, logits);
    const int64_t n = count.count();
    ASSERT_TRUE(res.ok()) << res.error().message;
    // The first step grows the runner's batch; every later one reuses it.
    if (pos > 0) {
      ASSERT_EQ(n, 0) << "decode step at position " << pos << " allocated " << n;
    }
  }
}

}  // namespace
}  // namespace kvant
