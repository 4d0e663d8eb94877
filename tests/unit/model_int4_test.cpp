// INT4 weight sets on the tiny golden models: quantized at load (RTN) they
// stay close to the BF16 set (stated KL bound), every product is INT4 (with
// a short last group where the group size does not divide), and with different precisions per
// phase prefill chunks run exactly the prefill set and one-token chunks
// exactly the decode set (bitwise against single-set models).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model_test_util.h"

namespace kvant {
namespace {

using test::golden_ids;
using test::mean_kl;

std::vector<float> run(Model& m, const std::vector<int32_t>& ids, int64_t chunk) {
  return test::run_chunked(m, ids, chunk);
}

class Int4ModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return std::string(KVANT_FIXTURES) + "/golden/" + GetParam(); }
};

TEST_P(Int4ModelTest, QuantizedAtLoadStaysCloseToBf16) {
  auto bf = Model::load(dir(), {WeightPrecision::kBf16, WeightPrecision::kBf16});
  ASSERT_TRUE(bf.ok()) << bf.error().message;
  const auto ids = golden_ids(GetParam());
  const auto ref = run(**bf, ids, int64_t(ids.size()));
  for (int group : {32, 64}) {
    WeightOptions o{WeightPrecision::kInt4, WeightPrecision::kInt4, group, false};
    auto q = Model::load(dir(), o);
    ASSERT_TRUE(q.ok()) << q.error().message;
    const auto& c = (*q)->config();
    const std::string prec = (*q)->set_precision(0);
    // Products whose input size the group divides are INT4, the rest BF16.
    // Every input size here is a multiple of 32 (the kernels' block); where
    // the group does not divide it the last group is short.
    EXPECT_EQ(prec, "int4") << GetParam() << " g" << group;
    EXPECT_LT((*q)->set_bytes(0), (*bf)->set_bytes(0));
    const auto got = run(**q, ids, int64_t(ids.size()));
    const double kl = mean_kl(ref, got, c.vocab);
    std::printf("%s g%d (%s): mean KL vs BF16 weights %.5f\n", GetParam().c_str(), group,
                prec.c_str(), kl);
    // Random-weight models are harder to quantize than trained ones (no
    // structure, flat logits); observed 0.001-0.01.
    EXPECT_LT(kl, 0.05) << GetParam() << " g" << group;
  }
}

TEST_P(Int4ModelTest, EachPhaseRunsItsOwnSet) {
  const auto ids = golden_ids(GetParam());
  const int64_t n = int64_t(ids.size());
  auto bf = Model::load(dir(), {WeightPrecision::kBf16, WeightPrecision::kBf16});
  auto q4 = Model::load(dir(), {WeightPrecision::kInt4, WeightPrecision::kInt4, 32, false});
  auto split = Model::load(dir(), {WeightPrecision::kBf16, WeightPrecision::kInt4, 32, false});
  ASSERT_TRUE(bf.ok() && q4.ok() && split.ok());
  EXPECT_NE((*split)->prefill_set(), (*split)->decode_set());
  const size_t bytes = size_t(n) * size_t((*bf)->config().vocab) * sizeof(float);
  // Prefill chunks (more than one token) -> the BF16 set.
  EXPECT_EQ(0, std::memcmp(run(**split, ids, n).data(), run(**bf, ids, n).data(), bytes));
  // One token at a time -> the INT4 set.
  EXPECT_EQ(0, std::memcmp(run(**split, ids, 1).data(), run(**q4, ids, 1).data(), bytes));
}

INSTANTIATE_TEST_SUITE_P(Archs, Int4ModelTest,
                         ::testing::Values("llama3", "llama_tied", "qwen2", "qwen3", "gemma3"));

}  // namespace
}  // namespace kvant
