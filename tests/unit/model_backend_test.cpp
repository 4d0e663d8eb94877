// The model over its backend: a decode step allocates nothing once the
// workspace is planned (Model::reserve, as the engine does at creation),
// for dense, MoE, latent-attention and sparse-attention models; weight
// reports come from one walk over every linear product (shared experts and
// the sparse indexer included); an unknown backend fails loading clearly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "alloc_counter.h"
#include "backend/backend.h"
#include "model/model.h"

namespace kvant {
namespace {

std::string fixture(const std::string& name) {
  return std::string(KVANT_FIXTURES) + "/golden/" + name;
}

class ModelDecodeAllocs : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelDecodeAllocs, DecodeStepAllocatesNothing) {
  auto m = Model::load(fixture(GetParam()));
  ASSERT_TRUE(m.ok()) << m.error().message;
  Model& model = **m;
  const auto& c = model.config();
  constexpr int64_t kSeqs = 3, kCtx = 80;
  model.reserve(16, kCtx);
  std::vector<std::unique_ptr<SeqKv>> kv;
  for (int i = 0; i < kSeqs; ++i) kv.push_back(std::make_unique<SeqKv>(c, kCtx));
  std::vector<float> logits(size_t(kSeqs * c.vocab));
  Batch b;
  b.tokens.reserve(kSeqs);
  b.seqs.reserve(kSeqs);
  // Decode steps from the first position on (no prefill first), then past
  // index_topk positions so that the sparse choice is taken.
  for (int64_t pos = 0; pos < kCtx - 1; ++pos) {
    b.tokens.clear();
    b.seqs.clear();
    for (int i = 0; i < kSeqs; ++i) {
      b.tokens.push_back(int32_t((pos * 7 + i * 13) % c.vocab));
      b.seqs.push_back({kv[size_t(i)].get(), pos, 1, false});
    }
    testing::AllocCounter count;
    auto r = model.forward(b, logits);
    const int64_t n = count.count();
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(n, 0) << GetParam() << ": decode step at position " << pos << " allocated " << n
                    << " times";
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelDecodeAllocs,
                         ::testing::Values("llama3", "gemma3", "qwen3_moe", "glm4_moe",
                                           "deepseek_v3", "glm_moe_dsa_sparse"));

TEST(ModelWeights, ReportsCoverEveryProduct) {
  // A hand-made set: one MoE layer with two routed experts and a shared
  // expert, latent-attention products and the sparse indexer's query product.
  auto bf16 = [](int64_t rows, int64_t cols) {
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.packed = AlignedBuffer<uint16_t>(size_t(rows * cols));
    return m;
  };
  auto q4 = [](int64_t rows, int64_t cols) {
    Q4Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.group = 32;
    m.w = AlignedBuffer<uint8_t>(size_t(rows * cols / 2));
    m.scales = AlignedBuffer<uint16_t>(size_t(rows * cols / 32));
    return m;
  };
  ModelWeights w;
  w.embed = bf16(10, 4);
  w.layers.resize(1);
  LayerWeights& L = w.layers[0];
  L.wqkv_q.q4 = q4(8, 32);
  L.wo_q.q4 = q4(4, 32);
  L.router = bf16(2, 4);
  L.experts.resize(2);
  for (auto& X : L.experts) X.gate_up_q.q4 = q4(8, 32), X.down_q.q4 = q4(4, 32);
  L.shared.gate_up = bf16(8, 32);
  L.shared.down = bf16(4, 32);
  L.wkv_b = bf16(6, 2);
  L.idx_wq_b = bf16(3, 5);
  size_t want = 0;
  for (const Matrix* m : {&w.embed, &L.router, &L.shared.gate_up, &L.shared.down, &L.wkv_b, &L.idx_wq_b})
    want += m->bytes();
  for (const QMatrix* m : {&L.wqkv_q, &L.wo_q}) want += m->bytes();
  for (auto& X : L.experts) want += X.gate_up_q.bytes() + X.down_q.bytes();
  EXPECT_EQ(weights_bytes(w), want);
  // The shared expert is BF16 while everything else that can be is INT4.
  EXPECT_EQ(weights_precision(w), "mixed");
  L.shared.gate_up_q.q4 = q4(8, 32);
  L.shared.down_q.q4 = q4(4, 32);
  L.shared.gate_up = Matrix();
  L.shared.down = Matrix();
  EXPECT_EQ(weights_precision(w), "int4");
  int products = 0;
  for_each_linear(w, [&](const LinearInfo&) { ++products; });
  EXPECT_EQ(products, 1 + 2 + 1 + 4 + 2 + 1 + 1);  // embed, qkv|o, router, experts, shared, kv_b, indexer
}

TEST(ModelBackend, UnknownBackendFailsLoading) {
  WeightOptions o;
  o.backend = "tpu";
  auto m = Model::load(fixture("llama3"), o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("unknown backend 'tpu'"), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find("cpu"), std::string::npos) << m.error().message;
}

}  // namespace
}  // namespace kvant
