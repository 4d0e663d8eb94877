// The real SmolLM2-135M GGUF: kvant's greedy continuation of 5 prompts × 64
// tokens equals transformers' on the same file (tools/fixtures/gen_greedy.py).
// The asserted reference uses kvant's numeric recipe (BF16 weights, BF16
// inputs to every matrix product, BF16 K/V); agreement with plain FP32
// transformers is printed, since greedy paths legitimately part at near-ties.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"

namespace kvant {
namespace {

std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& prompt, int n) {
  const auto& c = m.config();
  SeqKv kv(c, int64_t(prompt.size()) + n);
  std::vector<float> logits(size_t(c.vocab));
  Batch b;
  b.tokens = prompt;
  b.seqs.push_back({&kv, 0, int64_t(prompt.size()), false});
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto r = m.forward(b, logits);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    b.tokens = {next};
    b.seqs[0] = {&kv, int64_t(prompt.size()) + i, 1, false};
  }
  return out;
}

TEST(GreedySmolLM2, MatchesTransformersOnTheSameGguf) {
  const std::string path = std::string(KVANT_MODELS) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run scripts/fetch_model.sh";
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::ifstream f(std::string(KVANT_FIXTURES) + "/greedy/smollm2.json");
  auto j = nlohmann::json::parse(f);
  int cases = 0;
  for (auto& cs : j["cases"]) {
    auto ids = cs["ids"].get<std::vector<int32_t>>();
    auto ref = cs["bf16"].get<std::vector<int32_t>>();
    auto fp32 = cs["fp32"].get<std::vector<int32_t>>();
    auto got = greedy(**m, ids, int(ref.size()));
    EXPECT_EQ(got, ref) << "prompt: " << cs["prompt"].get<std::string>();
    size_t same = 0;
    while (same < got.size() && got[same] == fp32[same]) ++same;
    std::printf("[greedy] %-40.40s recipe ref: %s, fp32 ref: first %zu/%zu tokens equal\n",
                cs["prompt"].get<std::string>().c_str(), got == ref ? "equal" : "DIFFERENT", same,
                got.size());
    ++cases;
  }
  EXPECT_EQ(cases, 5);
}

}  // namespace
}  // namespace kvant
